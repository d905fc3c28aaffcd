"""Every file moeconf writes (`inspect -o`, `compile --write`, `init -o`, `lint -o`, `explain
--plan`, `write_manifest`): regular files and new paths atomically, links followed, permissions
kept, devices/FIFOs/directories refused (exit 2, the path named), standard streams written
straight through, and no temporary file left behind. Nothing here writes to /dev/null or any
device through a rename; each device test checks afterwards that the device is still one."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import moeconf
from moeconf.atomic import write_output, write_text_atomic
from moeconf.cli import main
from moeconf.errors import MoeconfError
from tests.conftest import EXAMPLES, REPO

MANIFEST = str(EXAMPLES / "models" / "kimi-k2.manifest.json")
PLAN = str(EXAMPLES / "plans" / "glm-4.5-air.toml")
IS_ROOT = os.geteuid() == 0


def _assert_dev_null_intact() -> None:
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode), "/dev/null is no longer a character device"


def _commands(out: str) -> list[list[str]]:
    """Every CLI command that writes a file, writing to `out`."""
    return [
        ["inspect", MANIFEST, "-o", out],
        ["inspect", MANIFEST, "--manifest", "-o", out],
        ["compile", PLAN, "-q", "--write", out],
        ["init", MANIFEST, "--force", "-o", out],
        ["lint", str(EXAMPLES / "deploy" / "run-glm-air.sh"), "-o", out],
        ["explain", MANIFEST, "--ot", "exps=CPU", "--plan", out],
    ]


def _listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("index", range(6), ids=["inspect", "manifest", "compile", "init", "lint", "explain"])
def test_every_writer_creates_and_replaces_regular_files(tmp_path: Path, index: int,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out.txt"
    args = _commands(str(target))[index]
    rc, _, err = run_cli(args, capsys)
    assert rc in (0, 1), err  # lint exits 1 on its findings
    first = target.read_text()
    assert first
    target.write_text("old content\n")
    target.chmod(0o640)
    rc, _, err = run_cli(args, capsys)
    assert rc in (0, 1), err
    assert target.read_text() == first
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert _listing(tmp_path) == ["out.txt"]  # no temporary file left


@pytest.mark.parametrize("index", range(6), ids=["inspect", "manifest", "compile", "init", "lint", "explain"])
def test_every_writer_refuses_a_directory_and_a_fifo(tmp_path: Path, index: int,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, kind in ((folder, "is a directory"), (fifo, "is a FIFO")):
        rc, out, err = run_cli(_commands(str(target))[index], capsys)
        assert rc == 2 and out == "", err
        assert err.startswith(f"moeconf: error: {target}: ") and kind in err, err
        assert "Traceback" not in err
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and folder.is_dir()
    assert _listing(tmp_path) == ["fifo", "folder"]
    assert _listing(folder) == []


def test_a_device_is_refused_not_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A link to a device is followed and refused; the device stays a device. (/dev/zero: writing
    it would be harmless, replacing it would not.)"""
    link = tmp_path / "to-zero"
    link.symlink_to("/dev/zero")
    with pytest.raises(MoeconfError, match="is a character device"):
        write_text_atomic(link, "x")
    rc, _, err = run_cli(["compile", PLAN, "-q", "--write", str(link)], capsys)
    assert rc == 2
    assert f"{link}: is a character device (the link's target /dev/zero)" in err
    assert stat.S_ISCHR(os.stat("/dev/zero").st_mode)
    assert link.is_symlink()
    null_link = tmp_path / "to-null"
    null_link.symlink_to(os.devnull)
    with pytest.raises(MoeconfError, match="is a character device"):
        write_text_atomic(null_link, "x")  # only the literal /dev/null is a discard target
    _assert_dev_null_intact()
    assert _listing(tmp_path) == ["to-null", "to-zero"]


def test_dev_null_discards_without_touching_it(capsys: pytest.CaptureFixture[str]) -> None:
    before = os.stat(os.devnull)
    write_output(os.devnull, "discarded")
    rc, out, err = run_cli(["inspect", MANIFEST, "-o", os.devnull], capsys)
    assert rc == 0 and out == "" and err == ""
    after = os.stat(os.devnull)
    _assert_dev_null_intact()
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    with pytest.raises(MoeconfError, match="is a character device"):
        write_text_atomic(os.devnull, "x")  # the atomic writer itself never renames over it
    _assert_dev_null_intact()


@pytest.mark.parametrize("name", ["-", "/dev/stdout", "/dev/stderr", "/dev/fd/1"])
def test_standard_streams_are_written_straight_through(tmp_path: Path, name: str) -> None:
    """Through a real process: its stdout/stderr are files here, which must be appended to, not
    renamed over (the shell still holds them)."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as o, err.open("w") as e:
        r = subprocess.run([sys.executable, "-m", "moeconf", "compile", PLAN, "-q", "--target", "ot",
                            "--write", name], stdout=o, stderr=e, cwd=REPO, timeout=120)
    assert r.returncode == 0, err.read_text()
    where = err if name == "/dev/stderr" else out
    other = out if where is err else err
    assert "exps=CPU" in where.read_text()
    assert other.read_text() == ""
    assert _listing(tmp_path) == ["stderr.txt", "stdout.txt"]


def test_a_symlink_is_followed_and_stays_a_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    real = real_dir / "launch.sh"
    real.write_text("old\n")
    real.chmod(0o750)
    link = tmp_path / "launch.sh"
    link.symlink_to(real)
    chain = tmp_path / "chain.sh"
    chain.symlink_to(link)  # a link to a link: the final target is replaced
    rc, _, err = run_cli(["compile", PLAN, "-q", "--write", str(chain)], capsys)
    assert rc == 0, err
    assert link.is_symlink() and chain.is_symlink()
    assert os.readlink(chain) == str(link)
    text = real.read_text()
    assert text.startswith("# generated by `moeconf compile ")
    assert stat.S_IMODE(real.stat().st_mode) == 0o750
    assert _listing(tmp_path) == ["chain.sh", "launch.sh", "real"]
    assert _listing(real_dir) == ["launch.sh"]


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "plan.toml"
    link.symlink_to("made.toml")
    write_text_atomic(link, "x = 1\n")
    assert link.is_symlink()
    assert (tmp_path / "made.toml").read_text() == "x = 1\n"


def test_new_file_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640


def test_missing_folder_and_trailing_slash(tmp_path: Path) -> None:
    with pytest.raises(MoeconfError, match="No such file or directory"):
        write_text_atomic(tmp_path / "no" / "such.txt", "x")
    with pytest.raises(MoeconfError, match="names a directory"):
        write_text_atomic(str(tmp_path / "new") + "/", "x")
    assert _listing(tmp_path) == []


@pytest.mark.skipif(not IS_ROOT, reason="changing a file's owner needs root")
def test_owner_and_group_are_kept(tmp_path: Path) -> None:
    target = tmp_path / "owned.txt"
    target.write_text("old")
    os.chown(target, 65534, 65534)
    target.chmod(0o604)
    write_text_atomic(target, "new")
    st = target.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o604)
    assert target.read_text() == "new"


@pytest.mark.skipif(IS_ROOT, reason="root may write read-only files and folders")
def test_read_only_file_and_folder_are_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro.txt"
    ro.write_text("keep")
    ro.chmod(0o444)
    with pytest.raises(MoeconfError, match="read-only"):
        write_text_atomic(ro, "new")
    assert ro.read_text() == "keep"
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "f.txt").write_text("keep")
    folder.chmod(0o555)
    try:
        with pytest.raises(MoeconfError, match="creating a temporary file"):
            write_text_atomic(folder / "f.txt", "new")
        assert (folder / "f.txt").read_text() == "keep"
    finally:
        folder.chmod(0o755)


def test_failure_mid_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(MoeconfError, match="No space left on device"):
        write_text_atomic(target, "new content")
    assert target.read_text() == "old"
    assert _listing(tmp_path) == ["out.json"]


def test_library_write_manifest_refuses_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "m.json"
    os.mkfifo(fifo)
    inv = moeconf.load_inventory(MANIFEST)
    with pytest.raises(MoeconfError, match="is a FIFO"):
        moeconf.write_manifest(inv, str(fifo))
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_init_refuses_an_existing_link_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "plan.toml"
    link.symlink_to(tmp_path / "elsewhere.toml")  # dangling: still "exists" for --force purposes
    rc, _, err = run_cli(["init", MANIFEST, "-o", str(link)], capsys)
    assert rc == 2 and "already exists" in err
    assert _listing(tmp_path) == ["plan.toml"]


def test_sigterm_mid_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    """A CI timeout or a killed hook sends SIGTERM: the old file stays, the temporary one goes."""
    target = tmp_path / "out.txt"
    target.write_text("old")
    code = ("import os, sys, time\n"
            "import moeconf.atomic as a\n"
            "def stuck(fd):\n"
            "    print('writing', flush=True)\n"
            "    time.sleep(60)\n"
            "os.fsync = stuck\n"
            "a.write_text_atomic(sys.argv[1], 'new')\n")
    with subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True,
                          cwd=REPO) as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == "writing\n"
            assert len(_listing(tmp_path)) == 2  # the temporary file exists now
            p.terminate()
            assert p.wait(timeout=30) == 143
        finally:
            p.kill()
    assert _listing(tmp_path) == ["out.txt"]
    assert target.read_text() == "old"
