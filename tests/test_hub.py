"""Remote models against the Hub emulator on 127.0.0.1 (tests/hub_emulator.py): header-only
reads, the header cache, the local HF cache, gated and missing repos, and the faults (a server
that ignores Range, truncated bodies, slow answers, a header larger than the first range, a
shard missing from the listing). Nothing here reaches beyond 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.errors import MoeconfError
from moeconf.fixtures import LAYOUTS, write_layout
from moeconf.hub import load_model
from moeconf.hub.fetch import FIRST_RANGE, STATS, HubError
from moeconf.model.load import load_inventory
from tests.conftest import REPO
from tests.hub_emulator import GOOD_TOKEN, Hub, Repo

AIR = "unsloth/GLM-4.5-Air-GGUF"
VOCAB = 2000  # a small vocabulary keeps the headers small (one test writes the real one)


@pytest.fixture(scope="session")
def quant_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """GLM-4.5-Air in three quants as Unsloth lays them out: Q4_K_M at the root, Q8_0 split in 3
    in a folder, UD-Q2_K_XL at the root; an mmproj-less, imatrix-less repo."""
    d = tmp_path_factory.mktemp("hubfiles")
    lay = LAYOUTS["glm-4.5-air"]
    out: dict[str, Path] = {}
    for q, et, split, folder in (("Q4_K_M", "Q4_K", 0, ""), ("Q8_0", "Q8_0", 300, "Q8_0/"),
                                 ("UD-Q2_K_XL", "Q2_K", 0, "")):
        (d / folder).mkdir(exist_ok=True)
        ft = "Q2_K" if q.startswith("UD") else q
        for p in write_layout(replace(lay, expert_type=et, file_type=ft), d / folder / f"GLM-4.5-Air-{q}.gguf",
                              split_max_tensors=split, vocab=VOCAB):
            out[folder + p.name] = p
    return out


@pytest.fixture
def hub(quant_files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    h = Hub().start()
    h.repos[AIR] = Repo(dict(quant_files))
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    monkeypatch.setenv("MOECONF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "hf"))
    for var in ("MODEL_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "MOECONF_OFFLINE", "LLAMA_ARG_OFFLINE",
                "HF_TOKEN", "MOECONF_HUB_TTL", "MOECONF_HUB_TIMEOUT", "MOECONF_HUB_MAX_HEADER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved login token
    STATS.requests = STATS.bytes = 0
    yield h
    h.stop()


def _ranges(hub: Hub) -> int:
    """Range requests the client made: the first of each file goes to resolve/ and is redirected
    to the CDN (one request, two hops), later ones straight to the CDN, from past byte 0."""
    return sum(1 for m, p, r in hub.log if r and "/resolve/" in p) + sum(
        1 for m, p, r in hub.log if r and p.startswith("/cdn/") and not r.startswith("bytes=0-"))


def test_remote_inventory_equals_the_local_one(hub: Hub, quant_files: dict[str, Path]) -> None:
    inv = load_model(f"{AIR}:Q8_0")
    local = load_inventory(quant_files["Q8_0/GLM-4.5-Air-Q8_0-00001-of-00003.gguf"])
    assert inv == local and inv.source == f"{AIR}:Q8_0"
    assert inv.shards == tuple(f"Q8_0/GLM-4.5-Air-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3))
    # headers only: one range request per shard, never the tensor data
    assert _ranges(hub) == 3 and STATS.requests == 3
    assert STATS.bytes <= 3 * FIRST_RANGE
    assert all(r.startswith("bytes=0-") for m, p, r in hub.log if r)


def test_default_tag_and_any_shard(hub: Hub) -> None:
    assert load_model(AIR).metadata.file_type_name == "Q4_K_M"  # no tag: Q4_K_M first, as llama.cpp
    later = load_model(f"hf://{AIR}/Q8_0/GLM-4.5-Air-Q8_0-00002-of-00003.gguf")
    assert later == load_model(f"{AIR}:q8_0")


def test_warm_cache_is_offline_and_instant(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    cold = load_model(f"{AIR}:Q8_0")
    n = len(hub.log)
    t = time.perf_counter()
    assert load_model(f"{AIR}:Q8_0") == cold
    assert time.perf_counter() - t < 1.0 and len(hub.log) == n  # no request at all
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.stop()
    assert load_model(f"{AIR}:Q8_0") == cold


def test_a_stale_listing_is_asked_again_but_headers_are_kept_by_commit(hub: Hub,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    load_model(f"{AIR}:Q4_K_M")
    monkeypatch.setenv("MOECONF_HUB_TTL", "0")
    n = len(hub.log)
    load_model(f"{AIR}:Q4_K_M")
    new = hub.log[n:]
    assert [p for _, p, _ in new if "/api/models/" in p] and not [r for _, _, r in new if r]


def test_header_larger_than_the_first_range(hub: Hub, tmp_path: Path) -> None:
    """GLM's real vocabulary (151,552 tokens and merges) puts the tensor infos past 2 MiB: the
    parser's estimate makes the second range cover the rest (two requests, not a walk)."""
    big = write_layout(LAYOUTS["glm-4.5-air"], tmp_path / "GLM-4.5-Air-Q4_K_M.gguf")[0]
    hub.repos["o/big"] = Repo({big.name: big})
    inv = load_model("o/big:Q4_K_M")
    assert inv == load_inventory(big)
    assert _ranges(hub) == 2
    assert STATS.bytes < os.path.getsize(big) and STATS.bytes < 64 << 20


def test_server_ignoring_range_is_read_only_as_far_as_the_header(hub: Hub, quant_files: dict[str, Path]) -> None:
    hub.ignore_range = True
    inv = load_model(f"{AIR}:Q4_K_M")
    assert inv == load_inventory(quant_files["GLM-4.5-Air-Q4_K_M.gguf"])
    size = os.path.getsize(quant_files["GLM-4.5-Air-Q4_K_M.gguf"])
    assert STATS.bytes <= FIRST_RANGE < size // 1000  # 2 MiB of a 70 GB file


def test_header_cap_bounds_what_a_range_ignoring_server_costs(hub: Hub, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    big = write_layout(LAYOUTS["glm-4.5-air"], tmp_path / "M-Q4_K_M.gguf")[0]
    hub.repos["o/big"] = Repo({big.name: big})
    hub.ignore_range = True
    monkeypatch.setenv("MOECONF_HUB_MAX_HEADER", str(3 << 20))
    with pytest.raises(MoeconfError, match="header is larger than 3 MiB"):
        load_model("o/big:Q4_K_M")
    assert STATS.bytes <= 2 * (3 << 20)  # each answer is the file from byte 0: read twice at most


def test_truncated_bodies_are_asked_again_then_refused(hub: Hub, quant_files: dict[str, Path]) -> None:
    hub.truncate = 400_000  # every answer stops after 400 kB though it announced more
    inv = load_model(f"{AIR}:Q4_K_M")  # the rest is asked for with further ranges
    assert inv == load_inventory(quant_files["GLM-4.5-Air-Q4_K_M.gguf"])
    hub.truncate = 100
    with pytest.raises(HubError, match="more than 8 range requests"):
        load_model(f"{AIR}:UD-Q2_K_XL")


def test_slow_server_times_out_with_a_clear_error(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    load_model(f"{AIR}:Q4_K_M")  # the listing is cached now
    monkeypatch.setenv("MOECONF_HUB_TIMEOUT", "0.3")
    hub.delay = 1.5
    t = time.perf_counter()
    with pytest.raises(HubError, match=r"timed out after 0\.3 s"):
        load_model(f"{AIR}:Q8_0")
    assert time.perf_counter() - t < 1.4


def test_slow_listing_times_out(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOECONF_HUB_TIMEOUT", "0.3")
    hub.delay = 1.5
    with pytest.raises(HubError, match="timed out"):
        load_model(f"{AIR}:Q8_0")


def test_shard_missing_from_the_listing(hub: Hub) -> None:
    hub.hidden = {"Q8_0/GLM-4.5-Air-Q8_0-00002-of-00003.gguf"}
    with pytest.raises(HubError, match=r"shard 2 of 3 \(Q8_0/GLM-4.5-Air-Q8_0-00002-of-00003.gguf\) is not in the"):
        load_model(f"{AIR}:Q8_0")


def test_no_such_tag_lists_the_tags(hub: Hub) -> None:
    with pytest.raises(HubError) as e:
        load_model(f"{AIR}:Q5_K_M")
    assert "no model file for tag 'Q5_K_M'" in e.value.message
    assert e.value.hint == "its tags: Q4_K_M, UD-Q2_K_XL, Q8_0"


def test_no_such_repo_and_no_such_file(hub: Hub) -> None:
    with pytest.raises(HubError, match="no repo o/none"):
        load_model("o/none:Q4_K_M")
    with pytest.raises(HubError, match=r"has no file 'x\.gguf'"):
        load_model(f"hf://{AIR}/x.gguf")


def test_gated_repo_needs_the_token_and_the_cdn_never_sees_it(hub: Hub, quant_files: dict[str, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    hub.repos["o/gated"] = Repo({"GLM-4.5-Air-Q4_K_M.gguf": quant_files["GLM-4.5-Air-Q4_K_M.gguf"]}, gated=True)
    with pytest.raises(HubError, match=r"HTTP 403: access denied .*HF_TOKEN"):
        load_model("o/gated:Q4_K_M")
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert load_model("o/gated:Q4_K_M").metadata.arch == "glm4moe"
    sent = [(p, a) for p, a in hub.auth_seen if "/resolve/" in p]
    assert sent and all(a == f"Bearer {GOOD_TOKEN}" for _, a in sent[-1:])
    assert all(a is None for p, a in hub.auth_seen if p.startswith("/cdn/"))


def test_not_a_gguf_is_refused_with_the_file(hub: Hub) -> None:
    hub.repos["o/bad"] = Repo({"m-Q4_K_M.gguf": b"GGUF\x03\x00\x00\x00" + b"\xff" * 5000})
    with pytest.raises(MoeconfError, match=r"o/bad/m-Q4_K_M\.gguf"):
        load_model("o/bad:Q4_K_M")


def test_plain_url_keyed_by_etag(hub: Hub, quant_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    hub.plain["m/GLM-4.5-Air-Q4_K_M.gguf"] = quant_files["GLM-4.5-Air-Q4_K_M.gguf"]
    url = f"{hub.endpoint}/files/m/GLM-4.5-Air-Q4_K_M.gguf"
    inv = load_model(url)
    assert inv == load_inventory(quant_files["GLM-4.5-Air-Q4_K_M.gguf"]) and inv.source == url
    n = len(hub.log)
    load_model(url)
    assert len(hub.log) == n  # within the TTL: nothing asked
    monkeypatch.setenv("MOECONF_HUB_TTL", "0")
    load_model(url)
    assert [m for m, _, _ in hub.log[n:]] == ["HEAD"]  # the ETag is unchanged: the header is the cached one


def test_local_hf_cache_is_read_from_disk(hub: Hub, quant_files: dict[str, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A model llama.cpp already downloaded (LLAMA_CACHE/models--OWNER--NAME/snapshots/COMMIT)
    is read from disk: offline with no request, online with the listing only."""
    commit = hub.repos[AIR].commit
    snap = tmp_path / "hf" / "models--unsloth--GLM-4.5-Air-GGUF" / "snapshots" / commit
    (snap / "Q8_0").mkdir(parents=True)
    for name, p in quant_files.items():
        if name.startswith("Q8_0/"):
            (snap / name).symlink_to(p)
    (tmp_path / "hf" / "models--unsloth--GLM-4.5-Air-GGUF" / "refs").mkdir()
    (tmp_path / "hf" / "models--unsloth--GLM-4.5-Air-GGUF" / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    inv = load_model(f"{AIR}:Q8_0")  # the cached listing has only Q8_0: the default tags find it
    assert inv.metadata.file_type_name == "Q8_0" and hub.log == []
    with pytest.raises(HubError, match="no model file for tag 'Q4_K_M'"):
        load_model(f"{AIR}:Q4_K_M")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("MOECONF_CACHE_DIR", str(tmp_path / "cache2"))
    assert load_model(f"{AIR}:Q8_0") == inv
    assert not [r for _, _, r in hub.log if r]  # the listing was asked, no byte of the model


def test_hf_cache_directory_follows_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    from moeconf.hub.hfcache import cache_directory

    for var in ("LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", "/h")
    assert cache_directory() == "/h/.cache/huggingface/hub"
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert cache_directory() == "/x/huggingface/hub"
    monkeypatch.setenv("HF_HOME", "/hh")
    assert cache_directory() == "/hh/hub"
    monkeypatch.setenv("HF_HUB_CACHE", "/c")
    assert cache_directory() == "/c"
    monkeypatch.setenv("LLAMA_CACHE", "/l")
    assert cache_directory() == "/l"


def test_offline_and_not_cached_says_so(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match=r"offline, and unsloth/GLM-4\.5-Air-GGUF is in neither"):
        load_model(f"{AIR}:Q4_K_M")
    assert hub.log == []


# ---------------------------------------------------------------------------------------------
# the CLI and the other commands


def test_fit_repo_prints_the_quant_table(hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fit", AIR, "--gpu", "24GiB", "--ram", "128GiB", "-c", "32768"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    lines = out.out.splitlines()
    rows = {ln.split()[1] if ln.startswith("*") else ln.split()[0]: ln for ln in lines[3:6]}
    assert set(rows) == {"UD-Q2_K_XL", "Q4_K_M", "Q8_0"}
    assert rows["Q8_0"].startswith("*") and "yes" in rows["Q8_0"]  # the largest that fits
    assert "* the largest quant that fits: Q8_0" in out.out
    assert f"Q4_K_M: llama-server -hf {AIR}:Q4_K_M -ngl 999" in out.out
    assert f"-hf {AIR}:Q2_K_XL" in out.out  # the shortest tag that picks the UD file
    assert "headers" in out.err or "quants read" in out.err  # the progress line


def test_fit_repo_json_and_budgets_that_leave_out_the_largest(hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", AIR, "--gpu", "24GiB", "--ram", "80GiB", "-c", "32768", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by = {q["quant"]: q for q in data["quants"]}
    assert not by["Q8_0"]["fits"] and "system RAM" in by["Q8_0"]["why"]
    assert by["Q4_K_M"]["fits"] and data["largest_fitting"] == "Q4_K_M"
    q4 = by["Q4_K_M"]
    assert q4["argv"][:3] == ["llama-server", "-hf", f"{AIR}:Q4_K_M"]
    assert 0 < q4["experts_on_gpu"] < q4["experts_total"]
    assert q4["headroom"]["CUDA0"] >= 0 and q4["headroom"]["CPU"] >= 0
    # host bytes a token reads: the CPU's routed experts times 8 of 128
    assert q4["host_read_per_token"] == pytest.approx((q4["experts_total"] - q4["experts_on_gpu"]) * 8 / 128, rel=0.05)


def test_fit_repo_predicts_generation_on_the_described_machine(hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["fit", AIR, "--gpu", "24GiB", "--ram", "128GiB", "-c", "32768", "--no-detect"]
    assert main([*base, "--gpu-model", "RTX 4090", "--ram-speed", "DDR5-6000x2"]) == 0
    out = capsys.readouterr().out
    assert "generation t/s" in out.splitlines()[2]  # the column, with its error
    import moeconf.speed as sp

    assert f"(+-{round(sp.HOST_GEN_ERROR * 100)}%)" in out  # experts read from RAM: the hybrid error
    # a machine without its host's bandwidth: no column, and each fitting quant says what is missing
    assert main([*base, "--gpu-model", "RTX 4090", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    q4 = {q["quant"]: q for q in data["quants"]}["Q4_K_M"]
    assert "generation" not in q4
    assert q4["generation_not_predicted"] == "the machine description lacks host: memory_bandwidth"


def test_fit_repo_nothing_fits_is_exit_1(hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", AIR, "--gpu", "4GiB", "--ram", "8GiB", "-c", "32768"]) == 1
    assert "no quant fits these budgets" in capsys.readouterr().out


def test_inspect_remote_writes_the_manifest(hub: Hub, tmp_path: Path, quant_files: dict[str, Path]) -> None:
    out = tmp_path / "x.json"
    assert main(["inspect", f"{AIR}:Q8_0", "--manifest", "-o", str(out)]) == 0
    assert load_inventory(out) == load_inventory(quant_files["Q8_0/GLM-4.5-Air-Q8_0-00001-of-00003.gguf"])
    assert json.loads(out.read_text())["source"] == {"file": "GLM-4.5-Air-Q8_0-00001-of-00003.gguf", "shards": 3}


def test_inspect_remote_errors_are_exit_2(hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", f"{AIR}:Q5_K_M"]) == 2
    err = capsys.readouterr().err
    assert "no model file for tag 'Q5_K_M'" in err and "Traceback" not in err


def test_plan_with_a_remote_model_compiles_to_hf(hub: Hub, tmp_path: Path) -> None:
    from moeconf.compile import compile_plan

    plan = tmp_path / "p.toml"
    plan.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{AIR}:Q4_K_M"\n[engine]\nname = "llama.cpp"\n'
                    'gpus = ["CUDA0"]\n[flags]\nn_gpu_layers = "all"\n')
    c = compile_plan(str(plan))
    assert c.argv[1:3] == ("-hf", f"{AIR}:Q4_K_M")
    ik = plan.with_name("ik.toml")
    ik.write_text(plan.read_text().replace('"llama.cpp"', '"ik_llama.cpp"'))
    assert compile_plan(str(ik)).argv[1:5] == ("-hfr", AIR, "-hff", "GLM-4.5-Air-Q4_K_M.gguf")


def test_init_and_explain_take_remote_models(hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.toml"
    assert main(["init", f"{AIR}:Q4_K_M", "-o", str(out)]) == 0
    text = out.read_text()
    assert f'path = "{AIR}:Q4_K_M"' in text and "serve_path" not in text
    assert main(["compile", str(out), "-q"]) == 0
    assert f"-hf {AIR}:Q4_K_M" in capsys.readouterr().out
    assert main(["explain", f"{AIR}:Q4_K_M", "--", "-ngl", "99", "-ot", "exps=CPU", "-c", "4096"]) == 0
    assert "GLM-4.5-Air" in capsys.readouterr().out


def test_lint_resolves_hf_lines_and_runs_model_rules(hub: Hub, tmp_path: Path) -> None:
    from moeconf.linting.linter import lint

    sh = tmp_path / "run.sh"
    sh.write_text(f'llama-server -hf {AIR}:Q4_K_M -ngl 99 -fit off -ot "nothing_here=CPU,exps=CPU"\n'
                  f'llama-server -hf {AIR}:Q5_K_M -ngl 99 -fit off -ot "exps=CPU"\n'
                  f'llama-server -hf {AIR} --hf-file Q8_0/GLM-4.5-Air-Q8_0-00001-of-00003.gguf -ngl 99 -fit off '
                  '-ot "nothing_either=CPU"\n')
    res = lint([str(sh)])
    by_line: dict[int, list[str]] = {}
    for f in res.findings:
        by_line.setdefault(f.line, []).append(f"{f.name}: {f.message}")
    assert any(m.startswith("unmatched-pattern") and "nothing_here" in m for m in by_line[1])
    assert not any(m.startswith("model-unknown") for m in by_line[1])
    assert any(m.startswith("model-unknown") and "no model file for tag 'Q5_K_M'" in m
               and "Q4_K_M, UD-Q2_K_XL, Q8_0" in m for m in by_line[2])
    assert any(m.startswith("unmatched-pattern") and "nothing_either" in m for m in by_line[3])


def test_lint_maps_an_hf_line_in_models_config(hub: Hub, tmp_path: Path, quant_files: dict[str, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """[models] maps the -hf value to a committed manifest: lint needs no network (CI)."""
    from moeconf.linting.linter import lint
    from moeconf.model.manifest import write_manifest

    write_manifest(load_inventory(quant_files["GLM-4.5-Air-Q4_K_M.gguf"]), tmp_path / "air.json")
    (tmp_path / ".moeconf.toml").write_text(f'[models]\n"{AIR}:Q4_K_M" = "air.json"\n')
    (tmp_path / "run.sh").write_text(f'llama-server -hf {AIR}:Q4_K_M -ngl 99 -fit off -ot "nothing_here=CPU"\n')
    hub.stop()
    res = lint([str(tmp_path / "run.sh")])
    assert any(f.name == "unmatched-pattern" for f in res.findings)


def test_lint_of_an_ik_hfr_line_without_a_file_says_why(hub: Hub, tmp_path: Path) -> None:
    from moeconf.linting.linter import lint

    (tmp_path / "run.sh").write_text(f'# moeconf: engine=ik_llama.cpp\nllama-server -hfr {AIR} -ngl 99 '
                                     '-ot "exps=CPU"\n')
    msgs = [f.message for f in lint([str(tmp_path / "run.sh")]).findings if f.name == "model-unknown"]
    assert msgs and "needs --hf-file" in msgs[0]


def test_start_up_and_warm_runs_do_not_import_huggingface_hub(hub: Hub) -> None:
    load_model(f"{AIR}:Q4_K_M")  # cold: the listing and header are cached now
    code = ("import sys; from moeconf.cli import main; "
            f"rc = main(['inspect', '{AIR}:Q4_K_M', '--json', '-o', '/dev/null']); "
            "print(rc, sorted(m for m in ('huggingface_hub', 'httpx', 'httpx2', 'requests') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                       env={**os.environ})
    assert r.stdout.strip() == "0 []", r.stdout + r.stderr


def test_solved_rows_are_reused_only_for_the_same_question(hub: Hub, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import moeconf.fitquants as fq

    args = ["fit", AIR, "--gpu", "24GiB", "-c", "32768", "--json"]
    assert main([*args, "--ram", "128GiB"]) == 0
    big = json.loads(capsys.readouterr().out)
    assert main([*args, "--ram", "80GiB"]) == 0  # another budget: solved again, not the cached rows
    small = json.loads(capsys.readouterr().out)
    assert big["largest_fitting"] == "Q8_0" and small["largest_fitting"] == "Q4_K_M"
    calls: list[str] = []
    real = fq._solve
    monkeypatch.setattr(fq, "_solve", lambda *a: calls.append(a[0].tag) or real(*a))
    assert main([*args, "--ram", "128GiB"]) == 0 and calls == []  # the same question: reused
    assert json.loads(capsys.readouterr().out) == big
    monkeypatch.setattr(fq, "_CODE_HASH", ["another moeconf"])
    assert main([*args, "--ram", "128GiB"]) == 0 and len(calls) == 3  # other code: solved again


def test_an_mmproj_sibling_is_named_as_not_modelled(hub: Hub, quant_files: dict[str, Path]) -> None:
    hub.repos["o/vision"] = Repo({"m-Q4_K_M.gguf": quant_files["GLM-4.5-Air-Q4_K_M.gguf"],
                                  "mmproj-F16.gguf": b"GGUF"})
    for _ in range(2):  # cold, then from the header cache
        inv = load_model("o/vision:Q4_K_M")
        assert any("also downloads and loads mmproj-F16.gguf" in w and "not modelled" in w for w in inv.warnings)


def test_a_missing_relative_path_is_named_as_both(hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "models/glm"]) == 2
    assert "models/glm: no such file, and no repo models/glm" in capsys.readouterr().err


def test_the_token_goes_to_the_hub_only(hub: Hub, quant_files: dict[str, Path],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    hub.plain["GLM-4.5-Air-Q4_K_M.gguf"] = quant_files["GLM-4.5-Air-Q4_K_M.gguf"]
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # another host than the URL's
    load_model(f"{hub.endpoint}/files/GLM-4.5-Air-Q4_K_M.gguf")
    assert hub.auth_seen and all(a is None for _, a in hub.auth_seen)


def test_models_config_may_name_a_remote_model(hub: Hub, tmp_path: Path) -> None:
    from moeconf.linting.linter import lint

    (tmp_path / ".moeconf.toml").write_text(f'[models]\n"air.gguf" = "{AIR}:Q4_K_M"\n')
    (tmp_path / "run.sh").write_text('llama-server -m /models/air.gguf -ngl 99 -fit off -ot "nothing_here=CPU"\n')
    res = lint([str(tmp_path / "run.sh")])
    assert any(f.name == "unmatched-pattern" for f in res.findings), res.findings


def test_explain_takes_the_model_from_the_command_line(hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--json", "--", "-hf", f"{AIR}:Q8_0", "-ngl", "99", "-fit", "off", "-ot", "exps=CPU",
                 "-c", "4096"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["memory"]["CPU"]["weights"] > 0
    assert main(["explain", "--", "-hf", AIR, "--hf-file", "GLM-4.5-Air-Q4_K_M.gguf", "-ngl", "99", "-c",
                 "4096"]) in (0, 1)
    assert "GLM-4.5-Air" in capsys.readouterr().out
    assert main(["explain", "--", "-ngl", "99"]) == 2
    assert "give MODEL, or a command line with -m or -hf" in capsys.readouterr().err


def test_compile_model_option_takes_a_remote_model(hub: Hub, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.toml"
    plan.write_text('rules = ["experts -> cpu"]\n[model]\npath = "missing.gguf"\n[engine]\nname = "llama.cpp"\n'
                    'gpus = ["CUDA0"]\n[flags]\nn_gpu_layers = "all"\n')
    assert main(["compile", str(plan), "--model", f"hf://{AIR}/GLM-4.5-Air-Q4_K_M.gguf", "-q"]) == 0
    assert f"-hf {AIR} --hf-file GLM-4.5-Air-Q4_K_M.gguf" in capsys.readouterr().out
