"""Every lint rule's own documentation examples: FAIL examples must produce the rule's finding,
PASS examples must not. The docs cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from moeconf.linting.linter import lint
from moeconf.linting.rules import ALL
from tests.conftest import EXAMPLES

_HEAD = re.compile(r"^(FAIL|PASS)(?: \((?P<opts>[^)]*)\))?:$")


def examples(rule: ModuleType) -> list[tuple[str, dict[str, str], str]]:
    doc = rule.__doc__ or ""
    lines = doc.splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _HEAD.match(lines[i].strip())
        if not m:
            i += 1
            continue
        opts = dict(kv.split("=", 1) for kv in (m.group("opts") or "").split(", ") if kv)
        body = []
        i += 1
        while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
            if lines[i].strip():
                body.append(lines[i][4:])
            i += 1
        out.append((m.group(1), opts, "\n".join(body) + "\n"))
    return out


CASES = [(rule, kind, opts, body) for rule in ALL for kind, opts, body in examples(rule)]


def test_every_rule_has_fail_and_pass_examples() -> None:
    for rule in ALL:
        kinds = {k for k, _, _ in examples(rule)}
        assert kinds == {"FAIL", "PASS"}, rule.NAME
        assert re.fullmatch(r"MOE\d{3}", rule.CODE)
        assert rule.__doc__ and rule.__doc__.split(":", 1)[0].strip() == rule.NAME
    codes = [r.CODE for r in ALL]
    names = [r.NAME for r in ALL]
    assert len(set(codes)) == len(codes) and len(set(names)) == len(names)


@pytest.mark.parametrize(("rule", "kind", "opts", "body"), CASES,
                         ids=[f"{r.NAME}-{k}" for r, k, _, _ in CASES])
def test_rule_examples(tmp_path: Path, rule: ModuleType, kind: str, opts: dict[str, str], body: str) -> None:
    model = opts.get("model")
    cfg = [f'engine = "{opts.get("engine", "llama.cpp")}"']
    if "version" in opts:
        cfg.append(f'engine_version = "{opts["version"]}"')
    if "gpu_memory" in opts:
        sizes = ", ".join(f'"{d}" = "{s}"' for d, s in (x.split(":") for x in opts["gpu_memory"].split("+")))
        cfg.append(f"gpu_memory = {{{sizes}}}")
    if model:
        cfg.append("[models]")
        cfg.append(f'"m.gguf" = "{EXAMPLES}/models/{model}.manifest.json"')
        cfg.append(f'"/models/m.gguf" = "{EXAMPLES}/models/{model}.manifest.json"')
    (tmp_path / ".moeconf.toml").write_text("\n".join(cfg) + "\n")
    name = opts.get("file", "launch.sh")
    if model:
        body = body.replace("@MODEL@", f"{EXAMPLES}/models/{model}.manifest.json")
    llama_config = None
    body, sep, ini = body.partition("--- llama.cpp config.ini ---\n")
    if sep:  # the example's llama.cpp config file (engines/llamaconfig.py), in place of this machine's
        from moeconf.engines.llamaconfig import load

        (tmp_path / "config.ini").write_text(ini)
        llama_config = load([str(tmp_path / "config.ini")])
    (tmp_path / name).write_text(body)
    result = lint([str(tmp_path / name)], llama_config=llama_config)
    mine = [f for f in result.findings if f.code == rule.CODE]
    if kind == "FAIL":
        assert mine, f"{rule.NAME}: FAIL example produced no finding; got {[f.text() for f in result.findings]}"
        for f in mine:
            assert f.line >= 1 and f.column >= 1
    else:
        assert not mine, f"{rule.NAME}: PASS example produced {[f.text() for f in mine]}"


def test_docs_list_every_rule() -> None:
    from tests.conftest import REPO

    page = (REPO / "docs" / "lint.md").read_text()
    for rule in ALL:
        assert f"| `{rule.CODE}` | `{rule.NAME}` | {rule.SEVERITY} |" in page, rule.NAME


@pytest.mark.parametrize("ot", [
    "exps=CPU,blk\\.(1|2|3)\\.=CUDA0",  # catch-all first: the second item moves nothing
    "exps=CPU,blk\\.(1|2|3)\\.ffn_.*_exps=CUDA0",  # never used
    "blk\\.0\\.attn_.*=CPU,exps=CPU,blk\\.(1|2|3)\\.ffn_.*_exps=CUDA0",  # the taker is not the first item
])
def test_shadowed_rule_advice_works_when_applied(tmp_path: Path, ot: str) -> None:
    """MOE011's reordered -ot, applied, sends the item's tensors to its device and leaves no MOE011."""
    import shlex

    from moeconf import explain
    from moeconf.model.load import load_inventory

    manifest = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"
    inv = load_inventory(str(manifest))
    (tmp_path / ".moeconf.toml").write_text(f'engine = "llama.cpp"\n[models]\n"m.gguf" = "{manifest}"\n')
    line = f"llama-server -m m.gguf -ngl 999 -fit off -ot '{ot}'"
    (tmp_path / "run.sh").write_text(line + "\n")
    found = [f for f in lint([str(tmp_path / "run.sh")]).findings if f.code == "MOE011"]
    assert len(found) == 1, found
    fixed = re.search(r"-ot '([^']*)'$", found[0].message)
    assert fixed, found[0].message
    before = explain(inv, shlex.split(line)).placement.devices
    applied = line.replace(ot, fixed.group(1))
    after = explain(inv, shlex.split(applied)).placement.devices
    assert after["blk.2.ffn_up_exps.weight"] == "CUDA0" != before["blk.2.ffn_up_exps.weight"]
    assert after["blk.20.ffn_up_exps.weight"] == "CPU"
    (tmp_path / "run.sh").write_text(applied + "\n")
    assert not [f for f in lint([str(tmp_path / "run.sh")]).findings if f.code == "MOE011"]


@pytest.mark.parametrize(("n", "says", "cpu_layers"), [
    (60, "the experts of block 60 stay on the GPU", 57),  # counts blocks: dense 0-2 take three of the 60
    (61, "every expert moves", 58),
])
def test_ncmoe_semantics_says_what_the_engine_does(tmp_path: Path, n: int, says: str, cpu_layers: int) -> None:
    """MOE017 on DeepSeek-V3 (61 blocks, dense 0-2): each claim checked against the placement."""
    import shlex

    from moeconf import explain
    from moeconf.model.load import load_inventory

    manifest = EXAMPLES / "models" / "deepseek-v3.manifest.json"
    (tmp_path / ".moeconf.toml").write_text(f'engine = "llama.cpp"\n[models]\n"m.gguf" = "{manifest}"\n')
    line = f"llama-server -m m.gguf -ngl 999 -fit off --n-cpu-moe {n}"
    (tmp_path / "run.sh").write_text(line + "\n")
    found = [f for f in lint([str(tmp_path / "run.sh")]).findings if f.code == "MOE017"]
    assert len(found) == 1 and says in found[0].message, found
    devices = explain(load_inventory(str(manifest)), shlex.split(line)).placement.devices
    on_cpu = {int(name.split(".")[1]) for name, d in devices.items() if "_exps." in name and d == "CPU"}
    assert len(on_cpu) == cpu_layers
    assert (devices["blk.60.ffn_up_exps.weight"] == "CPU") == (says == "every expert moves")


@pytest.mark.parametrize(("env", "at", "cut"), [
    ("LLAMA_ARG_MODEL=m.gguf\nLLAMA_ARG_N_GPU_LAYERS=999\nLLAMA_ARG_CTX_SIZE=32768\nLLAMA_ARG_OVERRIDE_TENSOR=exps=CPU\n",
     ":4:27:", False),
    ("LLAMA_ARG_MODEL=m.gguf\nLLAMA_ARG_N_GPU_LAYERS=999\nLLAMA_ARG_OVERRIDE_TENSOR=exps=CPU\n", ":3:27:", True),
])
def test_fit_conflict_in_a_dotenv_speaks_its_language(tmp_path: Path, env: str, at: str, cut: bool) -> None:
    """MOE020 on a .env: the context is read from LLAMA_ARG_CTX_SIZE, the finding sits on the
    placement's line, and its advice (LLAMA_ARG_FIT=off), applied, silences it."""
    manifest = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"
    (tmp_path / ".moeconf.toml").write_text(f'engine = "llama.cpp"\n[models]\n"m.gguf" = "{manifest}"\n')
    (tmp_path / ".env").write_text(env)
    found = [f for f in lint([str(tmp_path / ".env")]).findings if f.code == "MOE020"]
    assert len(found) == 1 and f".env{at}" in f"{found[0].path}:{found[0].line}:{found[0].column}:", found
    assert found[0].message.endswith("set LLAMA_ARG_FIT=off"), found[0].message
    assert ("LLAMA_ARG_CTX_SIZE is not given" in found[0].message) == cut and "-c is not" not in found[0].message
    (tmp_path / ".env").write_text(env + "LLAMA_ARG_FIT=off\n")
    assert not [f for f in lint([str(tmp_path / ".env")]).findings if f.code == "MOE020"]


@pytest.mark.parametrize(("ot", "fixed"), [
    ("blk\\.[0-2]\\.ffn_.*=CPU,exps=CPU", "exps=CPU"),  # dense blocks 0-2: no expert to keep on the CPU
    ("blk\\.[3-5]\\.ffn_.*=CPU,exps=CPU", "exps=CPU"),  # its experts go to the CPU through exps=CPU anyway
    ("blk\\.[3-5]\\.ffn_.*=CPU", "blk\\.[3-5]\\.ffn_.*_exps=CPU"),
])
def test_always_active_advice_works_when_applied(tmp_path: Path, ot: str, fixed: str) -> None:
    """MOE014/MOE015 on DeepSeek-V3: the advice (remove the item, or narrow it to the experts),
    applied, keeps every routed expert where the line put it and leaves no MOE014/MOE015."""
    import shlex

    from moeconf import explain
    from moeconf.model.load import load_inventory

    manifest = EXAMPLES / "models" / "deepseek-v3.manifest.json"
    (tmp_path / ".moeconf.toml").write_text(f'engine = "llama.cpp"\n[models]\n"m.gguf" = "{manifest}"\n')
    line = f"llama-server -m m.gguf -ngl 999 -fit off -ot '{ot}'"
    (tmp_path / "run.sh").write_text(line + "\n")
    found = [f for f in lint([str(tmp_path / "run.sh")]).findings if f.code in ("MOE014", "MOE015")]
    assert found
    want = "remove it" if fixed != ot.replace("ffn_.*=", "ffn_.*_exps=") else "write 'blk\\.[3-5]\\.ffn_.*_exps'"
    assert all(want in f.message for f in found), found
    inv = load_inventory(str(manifest))
    applied = line.replace(ot, fixed)
    before = explain(inv, shlex.split(line)).placement.devices
    after = explain(inv, shlex.split(applied)).placement.devices
    assert all(after[n] == before[n] for n in before if "_exps." in n)
    assert after["blk.4.ffn_gate_inp.weight"] == after["blk.4.attn_norm.weight"] == "CUDA0"
    (tmp_path / "run.sh").write_text(applied + "\n")
    assert not [f for f in lint([str(tmp_path / "run.sh")]).findings if f.code in ("MOE014", "MOE015")]
