"""Fuzzing the inputs moeconf reads: GGUF headers, split shards, manifests, plans and `-ot`
strings. Property: the CLI (`cli.main`, in process) returns 0, 1 or 2, prints a message when it
fails, never raises, stays within a few seconds and a bounded address space.

Bounded by default (the file runs in well under a minute); MOECONF_FUZZ_EXAMPLES=N raises the
number of examples per test, e.g. MOECONF_FUZZ_EXAMPLES=2000 for a long run."""

from __future__ import annotations

import copy
import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeconf.cli import main
from moeconf.errors import MoeconfError
from moeconf.fixtures import write_gguf
from moeconf.model.load import load_inventory
from tests.conftest import EXAMPLES, address_space_cap

EXAMPLES_PER_TEST = int(os.environ.get("MOECONF_FUZZ_EXAMPLES", "30"))
SECONDS_PER_INPUT = 5.0
FUZZ = settings(max_examples=EXAMPLES_PER_TEST, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
TRIED: dict[str, int] = {}


@pytest.fixture(autouse=True)
def bounded_memory() -> Iterator[None]:
    """At most 1 GiB more address space than now: a blow-up fails fast, it does not swap."""
    with address_space_cap():
        yield


def run_cli(capsys: pytest.CaptureFixture[str], *args: str, surface: str) -> int:
    TRIED[surface] = TRIED.get(surface, 0) + 1
    t = time.monotonic()
    code = main(list(args))
    elapsed = time.monotonic() - t
    _out, err = capsys.readouterr()
    assert code in (0, 1, 2), (args, code, err[-2000:])
    if code == 2:
        assert err.startswith("moeconf: error: "), err[-2000:]
    assert "Traceback" not in err
    assert elapsed < SECONDS_PER_INPUT, (args, elapsed)
    return code


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    total = sum(TRIED.values())
    print(f"\nfuzz inputs tried: {total} " + json.dumps(TRIED, sort_keys=True))


# --- GGUF headers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small real GGUF (written by gguf's own writer): a split-capable MoE header with arrays."""
    d = tmp_path_factory.mktemp("fuzzgguf")
    kv: list[tuple[str, Any, Any]] = [
        ("qwen3moe.block_count", 2, VT.UINT32), ("qwen3moe.expert_count", 4, VT.UINT32),
        ("qwen3moe.expert_used_count", 2, VT.UINT32), ("qwen3moe.attention.head_count_kv", [2, 2], None),
        ("general.name", "fuzz", VT.STRING), ("general.file_type", 0, VT.UINT32),
    ]
    tensors = [("token_embd.weight", "F32", (8, 4))]
    for il in range(2):
        tensors += [(f"blk.{il}.attn_q.weight", "F32", (8, 8)), (f"blk.{il}.ffn_gate_inp.weight", "F32", (8, 4)),
                    (f"blk.{il}.ffn_up_exps.weight", "F32", (8, 4, 4)),
                    (f"blk.{il}.ffn_down_exps.weight", "F32", (4, 8, 4))]
    tensors.append(("output.weight", "F32", (8, 4)))
    path = write_gguf(d / "fuzz.gguf", "qwen3moe", kv, tensors, data="zeros")[0]
    return path.read_bytes()


def test_truncation_at_every_offset(real_gguf: bytes, tmp_path: Path) -> None:
    """Every prefix of a real file: a clean error or (past the header) a clean read."""
    from moeconf.model.gguf_header import read_header

    p = tmp_path / "t.gguf"
    p.write_bytes(real_gguf)
    header_end = read_header(p).data_offset
    errors = 0
    for n in range(0, min(len(real_gguf), header_end + 64)):
        p.write_bytes(real_gguf[:n])
        TRIED["gguf-truncation"] = TRIED.get("gguf-truncation", 0) + 1
        try:
            load_inventory(p)
        except MoeconfError as e:
            assert str(p) in str(e)
            errors += 1
    assert errors > header_end - 64


def _u64_offsets(data: bytes) -> list[int]:
    return list(range(8, min(len(data), 4096) - 8))


@FUZZ
@given(data=st.data())
def test_gguf_header_mutations(real_gguf: bytes, tmp_path_factory: pytest.TempPathFactory,
                               capsys: pytest.CaptureFixture[str], data: st.DataObject) -> None:
    buf = bytearray(real_gguf)
    header_len = min(len(buf), 4096)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        kind = data.draw(st.sampled_from(["u64", "u32", "byte", "cut"]), label="kind")
        at = data.draw(st.integers(0, header_len - 8), label="offset")
        if kind == "u64":
            special = st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**62, 2**63, 2**64 - 1])
            v = data.draw(special | st.integers(0, 2**64 - 1))
            struct.pack_into("<Q", buf, at, v)
        elif kind == "u32":
            struct.pack_into("<I", buf, at, data.draw(st.sampled_from([0, 7, 9, 12, 13, 99, 2**31, 2**32 - 1])))
        elif kind == "byte":
            buf[at] = data.draw(st.integers(0, 255))
        else:
            del buf[at:]
            break
    p = tmp_path_factory.mktemp("g") / "m.gguf"
    p.write_bytes(bytes(buf))
    run_cli(capsys, "inspect", str(p), surface="gguf-mutation")


@FUZZ
@given(counts=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
       block_count=st.integers(0, 2**64 - 1), arr_len=st.integers(0, 2**64 - 1))
def test_gguf_huge_counts(tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
                          counts: tuple[int, int], block_count: int, arr_len: int) -> None:
    from tests import rawgguf as rg

    g = rg.minimal()
    g.kv[1] = ("qwen3moe.block_count", rg.U64, block_count)
    g.kv.append(("qwen3moe.attention.head_count_kv", rg.ARR, (rg.U32, [2])))
    raw = bytearray(g.build())
    at = raw.index(b"head_count_kv") + len(b"head_count_kv") + 4 + 4
    struct.pack_into("<Q", raw, at, arr_len)
    if counts[0] % 3 == 0:
        struct.pack_into("<QQ", raw, 8, counts[0], counts[1])
    p = tmp_path_factory.mktemp("h") / "m.gguf"
    p.write_bytes(bytes(raw))
    run_cli(capsys, "inspect", str(p), surface="gguf-counts")


_ARRAY_KEYS = ("attention.head_count_kv", "attention.head_count", "feed_forward_length",
               "attention.sliding_window_pattern")


@FUZZ
@given(key=st.sampled_from(_ARRAY_KEYS),
       items=st.lists(st.one_of(st.integers(0, 2**32 - 1).map(lambda v: (0, v)),
                                st.text(max_size=6).map(lambda v: (1, v)), st.booleans().map(lambda v: (2, v)),
                                st.floats(width=32, allow_nan=True).map(lambda v: (3, v))), max_size=4),
       digits=st.integers(1, 6000), name_tail=st.sampled_from([".attn_norm.weight", ".ffn_up_exps.weight", ""]))
def test_gguf_odd_arrays_and_block_numbers(tmp_path_factory: pytest.TempPathFactory,
                                          capsys: pytest.CaptureFixture[str], key: str, items: list[tuple[int, Any]],
                                          digits: int, name_tail: str) -> None:
    """Issue 18: a `head_count_kv` array of strings and a tensor named `blk.<5000 digits>` were
    internal errors (exit 3): metadata arrays of any element type, block numbers of any length."""
    from tests import rawgguf as rg

    g = rg.minimal()
    etype = {0: rg.U32, 1: rg.STR, 2: rg.BOOL, 3: rg.F32}
    kinds = {k for k, _ in items} or {0}
    if len(kinds) == 1:  # a GGUF array holds one element type
        k = kinds.pop()
        g.kv.append((f"qwen3moe.{key}", rg.ARR, (etype[k], [v for _, v in items])))
    g.tensors.append(("blk." + "7" * digits + name_tail, (64,), 0, 256))
    g.data_size = 512
    p = tmp_path_factory.mktemp("a") / "m.gguf"
    p.write_bytes(g.build())
    code = run_cli(capsys, "inspect", str(p), surface="gguf-arrays-blocks")
    # an array of a per-layer key holds one entry per block, or the engines refuse the file
    # ("wrong array length", llama-model-loader.cpp get_key_or_arr): so does moeconf
    from moeconf.model.homes import array_reading

    wrong_length = not items and array_reading(key) == "per_layer"
    assert code != 2 or digits > 9 or kinds or items or wrong_length  # a plain file with a short block number reads


@FUZZ
@given(version=st.one_of(st.tuples(st.sampled_from(["b", "", "v", "0.1."]), st.integers(1, 7000),
                                   st.sampled_from("0179")).map(lambda t: t[0] + t[2] * t[1]),
                         st.text(max_size=30)),
       engine=st.sampled_from(["llama.cpp", "ik_llama.cpp"]), command=st.sampled_from(["explain", "fit"]))
def test_engine_versions_of_any_length(capsys: pytest.CaptureFixture[str], version: str, engine: str,
                                       command: str) -> None:
    """`--engine-version b<5000 digits>` was an internal error (exit 3)."""
    if version.startswith("-") or "\0" in version:
        version = "v" + version.replace("\0", "")
    extra = ["--gpu", "24GiB", "-c", "4096"] if command == "fit" else ["--ot", "exps=CPU"]
    run_cli(capsys, command, OT_MANIFEST, "--engine", engine, "--engine-version", version, *extra,
            surface="engine-version")


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs /proc/self/mem (Linux)")
@pytest.mark.parametrize("command", ["inspect", "explain", "fit", "init", "lint"])
def test_a_file_that_fails_with_eio(capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Reading `/proc/self/mem` fails with EIO: a located error, exit 2, never exit 3."""
    extra = {"fit": ["--gpu", "24GiB"]}.get(command, [])
    code = run_cli(capsys, command, "/proc/self/mem", *extra, surface="eio")
    assert code in (1, 2)


@pytest.fixture(scope="module")
def split_files(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    d = tmp_path_factory.mktemp("split")
    files = write_gguf(d / "s.gguf", "qwen3moe", [("qwen3moe.block_count", 1, VT.UINT32)],
                       [("blk.0.attn_norm.weight", "F32", (8,)), ("blk.0.ffn_norm.weight", "F32", (8,)),
                        ("output_norm.weight", "F32", (8,))], split_max_tensors=1)
    return [f.read_bytes() for f in files]


@FUZZ
@given(links=st.lists(st.sampled_from(["file", "self", "s1", "s2", "s3", "missing", "dangling", "fifo", "zero"]),
                      min_size=3, max_size=3),
       start=st.integers(1, 3))
def test_split_shards_pointing_anywhere(split_files: list[bytes], tmp_path_factory: pytest.TempPathFactory,
                                        capsys: pytest.CaptureFixture[str], links: list[str], start: int) -> None:
    d = tmp_path_factory.mktemp("shards")
    names = [f"s-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for i, (name, how) in enumerate(zip(names, links, strict=True)):
        p = d / name
        if how == "file":
            p.write_bytes(split_files[i])
        elif how == "self":
            p.symlink_to(name)
        elif how in ("s1", "s2", "s3"):
            p.symlink_to(names[int(how[1]) - 1])
        elif how == "dangling":
            p.symlink_to("nowhere.gguf")
        elif how == "fifo":
            os.mkfifo(p)
        elif how == "zero":
            p.symlink_to("/dev/zero")
    run_cli(capsys, "inspect", str(d / names[start - 1]), surface="split-shards")


# --- manifests ------------------------------------------------------------------------------------

MANIFEST = json.loads((EXAMPLES / "models" / "gpt-oss-20b.manifest.json").read_text())

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:6]):
            yield from _paths(v, (*prefix, i))


@FUZZ
@given(data=st.data())
def test_manifest_mutations(tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
                            data: st.DataObject) -> None:
    doc = copy.deepcopy(MANIFEST)
    doc["tensors"] = doc["tensors"][:40]
    paths = [p for p in _paths(doc) if p]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = data.draw(st.sampled_from(paths), label="path")
        parent: Any = doc
        try:
            for part in path[:-1]:
                parent = parent[part]
            action = data.draw(st.sampled_from(["replace", "delete", "huge", "deep"]), label="action")
            if action == "delete":
                del parent[path[-1]]
            elif action == "huge":
                parent[path[-1]] = data.draw(st.sampled_from([10**12, 2**64, -1, 10**30, "9" * 50]))
            elif action == "deep":
                parent[path[-1]] = "__DEEP__"  # written as text below: json cannot build it
            else:
                parent[path[-1]] = data.draw(json_values, label="value")
        except (KeyError, IndexError, TypeError):
            continue
    try:
        text = json.dumps(doc).replace('"__DEEP__"', "[" * 3000 + "]" * 3000)
    except (ValueError, RecursionError):
        return
    if data.draw(st.booleans(), label="text-cut"):
        text = text[: data.draw(st.integers(0, len(text)), label="cut")]
    p = tmp_path_factory.mktemp("m") / "m.manifest.json"
    p.write_text(text)
    run_cli(capsys, "inspect", str(p), surface="manifest")


# --- plans ----------------------------------------------------------------------------------------

PLANS = sorted((EXAMPLES / "plans").glob("*.toml"))
toml_values = st.sampled_from([
    "1", "-1", "2147483648", "9" * 5000, "1e999", "nan", "inf", "true", '"x"', '""', '"$GPU"', '"cuda0"',
    "[1, 2]", "[]", '["CUDA0", "CUDA0"]', '["RPC0[h:1]"]', "{a = 1}", "[" * 600 + "]" * 600, '"banana"',
    '"b7600"', '"0.1.5"', '"experts -> cpu"', '["experts layers 0..99999999999 -> cpu"]', '"a\\u0000b"',
    '["experts layers 0..' + "9" * 5000 + ' -> cpu"]', '["(.|.)*Q -> cpu"]',
])


@FUZZ
@given(plan=st.sampled_from(PLANS), data=st.data())
def test_plan_mutations(tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
                        plan: Path, data: st.DataObject) -> None:
    lines = plan.read_text().splitlines()
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        i = data.draw(st.integers(0, len(lines) - 1), label="line")
        action = data.draw(st.sampled_from(["value", "delete", "chars", "dup"]), label="action")
        if action == "value" and "=" in lines[i]:
            key = lines[i].split("=", 1)[0]
            lines[i] = f"{key}= {data.draw(toml_values, label='value')}"
        elif action == "delete":
            del lines[i]
            if not lines:
                lines = [""]
        elif action == "dup":
            lines.insert(i, lines[i])
        else:
            j = data.draw(st.integers(0, len(lines[i])), label="at")
            lines[i] = lines[i][:j] + data.draw(st.text(max_size=5), label="chars") + lines[i][j:]
    d = tmp_path_factory.mktemp("p")
    p = d / "plan.toml"
    text = "\n".join(lines).replace('path = "../models/', f'path = "{EXAMPLES}/models/')
    p.write_bytes(text.encode("utf-8", errors="replace"))
    run_cli(capsys, "compile", str(p), "-q", surface="plan")


# --- -ot strings through explain ------------------------------------------------------------------

OT_MANIFEST = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
regex_chars = st.sampled_from([*"\\[](){}*+?|^$.-,=:!<>dwsbqAZ1089", "blk", "ffn_", "exps", "CPU", "CUDA0",
                               "RPC0[h:1]", r"\.", ".*"])


@FUZZ
@given(ot=st.lists(regex_chars, max_size=24).map("".join) | st.text(max_size=40),
       engine=st.sampled_from(["llama.cpp", "ik_llama.cpp"]),
       extra=st.lists(st.sampled_from(["-ngl", "99", "0", "--rpc", "h:1", "-ts", "1,1", "--n-cpu-mo", "-ncmoe", "3",
                                       "--cpu-moe", "-sm", "row", "--ctx-size=9", "-fa", "on"]), max_size=5))
def test_ot_strings_through_explain(capsys: pytest.CaptureFixture[str], ot: str, engine: str,
                                    extra: list[str]) -> None:
    if ot.startswith("-") or "\0" in ot:
        ot = "x" + ot.replace("\0", "")
    run_cli(capsys, "explain", OT_MANIFEST, "--engine", engine, "--gpus=CUDA0", "--", "llama-server",
            "-ot", ot, *extra, surface="ot")
