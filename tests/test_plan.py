"""Plans: loading, every error with file:line:col, rule semantics, the generated schema."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest

from moeconf.compile import compile_plan
from moeconf.errors import PlanError
from moeconf.model.inventory import format_ranges
from moeconf.model.load import load_inventory
from moeconf.plan import load_plan, plan_from_text
from moeconf.plan.schema import plan_schema
from moeconf.resolve import resolve
from tests.conftest import EXAMPLES, REPO

MODELS = EXAMPLES / "models"


def write_plan(tmp_path: Path, body: str, model: str = "deepseek-v3") -> Path:
    p = tmp_path / "plan.toml"
    text = body.replace("@MODEL@", str(MODELS / f"{model}.manifest.json"))
    p.write_text(text)
    return p


def error_of(tmp_path: Path, body: str, model: str = "deepseek-v3") -> PlanError:
    p = write_plan(tmp_path, body, model)
    with pytest.raises(PlanError) as ei:
        compile_plan(p)
    return ei.value


BASE = '[model]\npath = "@MODEL@"\nserve_path = "/m.gguf"\n'


def test_toml_syntax_error(tmp_path: Path) -> None:
    e = error_of(tmp_path, 'rules = ["experts -> cpu"\n[model]\n')
    assert (e.line, e.column) == (2, 1)
    assert "TOML syntax" in e.message


def test_unknown_key_with_suggestion(tmp_path: Path) -> None:
    e = error_of(tmp_path, BASE + "[flags]\nctx = 4096\nctx_sise = 4096\n")
    assert e.line == 5 and e.column == 1
    assert "unknown key 'ctx' in [flags]" in e.message
    e = error_of(tmp_path, BASE + "[flags]\nctx_sise = 4096\n")
    assert "did you mean 'ctx_size'?" in e.message


def test_wrong_type_points_at_value_key(tmp_path: Path) -> None:
    e = error_of(tmp_path, BASE + '[engine]\nname = "vllm"\n')
    assert (e.line, e.column) == (5, 1)
    assert "engine.name" in e.message and "llama.cpp" in e.message


def test_missing_model(tmp_path: Path) -> None:
    e = error_of(tmp_path, 'rules = ["experts -> cpu"]\n')
    assert "model is required" in e.message


def test_rules_inside_a_table(tmp_path: Path) -> None:
    e = error_of(tmp_path, BASE + 'rules = ["experts -> cpu"]\n')
    assert "'rules' is inside [model]" in e.message
    assert e.line == 4


def test_rule_syntax_error_has_caret_and_column(tmp_path: Path) -> None:
    e = error_of(tmp_path, 'rules = [\n  "experts -> cpu",\n  "shexp layers -> gpu",\n]\n' + BASE)
    assert e.line == 3
    # the rule string opens at column 3; "layers" ends at offset 12, so the caret is at column 17
    assert e.column == 3 + 1 + 13
    assert e.context is not None and e.context.splitlines()[1].index("^") == 4 + 13
    assert str(e).startswith(f"{e.path}:3:17: unexpected '->'")


def test_unknown_group_suggestion(tmp_path: Path) -> None:
    e = error_of(tmp_path, 'rules = ["expert layers 3.. -> cpu"]\n' + BASE)
    assert e.message == "unknown group or tensor kind 'expert'"
    assert e.hint == "did you mean 'experts'?"
    assert (e.line, e.column) == (1, 11)


@pytest.mark.parametrize(
    ("device", "fragment"),
    [
        ("cuda0", "case-sensitive: did you mean 'CUDA0'?"),
        ("CUDAx", "needs a device index"),
        ("CUDA_Host", "host/extra buffer type"),
        ("gpu1", "gpu1 names accelerator #1, but engine.gpus and flags.rpc give 1"),
        ("CUDA1", "device 'CUDA1' is not one this machine will have"),
        ("RPC0[10.0.0.2:50052]", "device 'RPC0[10.0.0.2:50052]' is not one"),
        ("RPC[10.0.0.2:50052]", "names RPC devices RPC0[host:port]"),
        ("Metal", "MTL0"),
        ("$DEV", "unexpanded variable"),
    ],
)
def test_bad_devices(tmp_path: Path, device: str, fragment: str) -> None:
    e = error_of(tmp_path, f'rules = ["experts -> {device}"]\n' + BASE)
    assert fragment in str(e)
    assert e.column == 11 + len("experts -> ")


def test_rpc_device_known_with_rpc_flag(tmp_path: Path) -> None:
    p = write_plan(tmp_path, 'rules = ["experts layers 3..9 -> RPC0[10.0.0.2:50052]"]\n' + BASE
                   + '[flags]\nrpc = ["10.0.0.2:50052"]\n')
    c = compile_plan(p)
    assert c.argv.index("--rpc") < c.argv.index("-ot")
    assert c.ot.endswith("=RPC0[10.0.0.2:50052]")


def test_ik_refuses_fit_with_rules(tmp_path: Path) -> None:
    ik_fit = '[engine]\nname = "ik_llama.cpp"\n[flags]\nfit = true\n'
    e = error_of(tmp_path, 'rules = ["experts -> cpu"]\n' + BASE + ik_fit)
    assert "refuses --fit together with -ot" in e.message
    assert e.line == 8


def test_manifest_without_serve_path(tmp_path: Path) -> None:
    e = error_of(tmp_path, 'rules = ["experts -> cpu"]\n[model]\npath = "@MODEL@"\n')
    assert "serve_path" in str(e)


def test_missing_plan_file(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no such file"):
        load_plan(tmp_path / "nope.toml")


# --- semantics ------------------------------------------------------------------------------


def placement(rules: list[str], model: str = "deepseek-v3", extra: str = "") -> dict[str, str | None]:
    rl = "[" + ", ".join(f'"{r}"' for r in rules) + "]"
    text = f"rules = {rl}\n" + BASE.replace("@MODEL@", str(MODELS / f"{model}.manifest.json")) + extra
    plan = plan_from_text(text, "/tmp/p.toml")
    return resolve(plan, load_inventory(plan.model_path)).placement.devices


def layers_on(devs: dict[str, str | None], base: str, device: str) -> str:
    return format_ranges(int(n.split(".")[1]) for n, d in devs.items()
                         if n.startswith("blk.") and n.split(".")[2] == base and d == device)


def test_later_rules_refine_earlier_ones() -> None:
    d = placement(["experts -> cpu", "experts layers 3..5 -> gpu"])
    assert layers_on(d, "ffn_up_exps", "CPU") == "6-60"
    assert layers_on(d, "ffn_up_exps", "CUDA0") == "3-5"
    assert layers_on(d, "ffn_up_shexp", "CUDA0") == "3-60"


def test_first_and_last_count_only_layers_with_the_group() -> None:
    d = placement(["experts -> cpu", "experts first 2 -> gpu", "experts last 1 -> gpu"])
    assert layers_on(d, "ffn_up_exps", "CUDA0") == "3-4, 60"  # blocks 0-2 are dense


def test_experts_do_not_include_nextn_blocks_and_mainline_skips_them() -> None:
    d = placement(["experts -> cpu"], "glm-4.5-air")
    assert layers_on(d, "ffn_up_exps", "CPU") == "1-45"
    assert d["blk.46.ffn_up_exps.weight"] is None  # llama.cpp does not create nextn tensors
    # nor does ik_llama.cpp 0.1.5 without MTP: it logs an override line for them, then skips them
    # ("model has unused tensor blk.5.ffn_up_exps.weight ... -- ignoring" on the engine suite's glm4moe)
    ik_015 = '[engine]\nname = "ik_llama.cpp"\nversion = "0.1.5"\n'
    d = placement(["experts -> cpu", "nextn -> cpu"], "glm-4.5-air", ik_015)
    assert d["blk.46.ffn_up_exps.weight"] is None
    assert d["blk.46.nextn.eh_proj.weight"] is None


def test_layer_kind_filter_and_layer_target() -> None:
    d = placement(["layer layers dense -> cpu"])
    assert layers_on(d, "ffn_up", "CPU") == "0-2"
    assert layers_on(d, "attn_q_a", "CPU") == "0-2"
    d = placement(["layers 1, 3, 5..7 -> cpu"])
    assert layers_on(d, "attn_norm", "CPU") == "1, 3, 5-7"


def test_defaults_follow_ngl() -> None:
    # mainline: -ngl 10 puts the output layer and the last 9 blocks on the GPU
    d = placement([], extra="[flags]\nn_gpu_layers = 10\n")
    assert layers_on(d, "attn_norm", "CUDA0") == "52-60"
    assert d["output.weight"] == "CUDA0"
    assert d["token_embd.weight"] == "CPU"
    # ik_llama.cpp: the last 10 blocks, and the output only when N exceeds the block count
    d = placement([], extra='[engine]\nname = "ik_llama.cpp"\n[flags]\nn_gpu_layers = 10\n')
    assert layers_on(d, "attn_norm", "CUDA0") == "51-60"
    assert d["output.weight"] == "CPU"


def test_warnings() -> None:
    text = ('rules = ["experts -> cpu", "experts -> gpu", "experts layers 70.. -> cpu", "attn_qkv -> cpu"]\n'
            + BASE.replace("@MODEL@", str(MODELS / "deepseek-v3.manifest.json")))
    plan = plan_from_text(text, "/tmp/p.toml")
    res = resolve(plan, load_inventory(plan.model_path))
    msgs = [str(w) for w in res.warnings]
    assert any("1:11: every tensor this rule selects is re-placed by a later rule" in m for m in msgs)
    assert any("beyond are ignored" in m for m in msgs)
    assert any("'attn_qkv' does not occur in this model" in m for m in msgs)


# --- schema ---------------------------------------------------------------------------------


def test_schema_file_is_up_to_date() -> None:
    on_disk = json.loads((REPO / "schemas" / "plan.schema.json").read_text())
    assert on_disk == plan_schema(), "stale: run `moeconf schema > schemas/plan.schema.json`"


@pytest.mark.parametrize("plan", sorted((EXAMPLES / "plans").glob("*.toml")), ids=lambda p: p.stem)
def test_examples_validate_against_schema(plan: Path) -> None:
    text = plan.read_text()
    assert text.startswith("#:schema ../../schemas/plan.schema.json")
    jsonschema.validate(tomllib.loads(text), plan_schema())


# --- the fast rule recognizer agrees with the grammar ------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from moeconf.plan.rules import _fast_parse, lark_parse_rule  # noqa: E402

_PIECES = ["experts", "shexp", "ffn_up_exps", "ffn_up_exps.bias", "attn", "layer", "all", "layers", "first",
           "last", "moe", "dense", "nextn", "3", "10", "0", "..", ",", "->", "\u2192", "cpu", "gpu1", "CUDA0",
           "RPC0[10.0.0.2:50052]", "$X", " ", "  ", "\t", ".", "-", "[", "x.1", "a b"]


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=9), st.lists(st.sampled_from(["", " "]), min_size=9,
                                                                            max_size=9))
def test_fast_rule_parser_agrees_with_lark(pieces: list[str], gaps: list[str]) -> None:
    text = "".join(p + g for p, g in zip(pieces, gaps, strict=False))
    fast = _fast_parse(text, 0)
    if fast is None:
        return
    assert lark_parse_rule(text, 0) == fast, text


@pytest.mark.parametrize("text", [
    "experts -> cpu", "experts layers 31.. -> cpu", "experts, shexp layers 3..10 -> gpu1",
    "ffn_up_exps last 8 -> CUDA1", "layer layers moe -> RPC0[10.0.0.2:50052]", "layers ..30,40, 50..52 -> gpu",
    "first 4 -> gpu", "layers first 4 -> gpu", "ffn_up_exps.bias layers 1 → cpu", "all -> CPU",
    "experts -> gpu, cpu", "experts layers 3.. -> gpu,gpu1 , cpu", "ffn_down_exps -> RPC0[10.0.0.2:50052], CPU",
])
def test_fast_rule_parser_takes_the_common_shapes(text: str) -> None:
    fast = _fast_parse(text, 0)
    assert fast is not None
    assert fast == lark_parse_rule(text, 0)


# --- validation without pydantic agrees with pydantic --------------------------------------------

from moeconf.plan.config import Section, plan_schema_file, validate  # noqa: E402
from moeconf.plan.model import PlanModel  # noqa: E402

_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70000), st.floats(-2, 5, allow_nan=False), st.sampled_from(
        ["all", "llama.cpp", "ik_llama.cpp", "on", "auto", "q8_0", "CUDA0", "10.0.0.2:50052", "a b:1", "h:x", "cuda",
         "graph", "x", ""]),
    st.lists(st.sampled_from(["CUDA0", "10.0.0.2:50052", "h:1,2", "-v"]), max_size=3),
    st.lists(st.one_of(st.integers(0, 3), st.floats(0, 2, allow_nan=False), st.booleans()), max_size=3),
)
_KEYS = {
    "model": ["path", "serve_path", "x"],
    "engine": ["name", "version", "gpus", "x"],
    "flags": ["n_gpu_layers", "fit", "ctx_size", "batch", "ubatch", "flash_attn", "no_mmap", "merge_qkv", "split_mode",
              "tensor_split", "main_gpu", "rpc", "threads", "extra", "cache_type_k", "x"],
    "targets": ["binary", "port", "docker_backend", "docker_volumes", "compose_service", "x"],
    "budget": ["reserve", "policy", "split", "gpu", "CUDA1", "x"],  # devices are extra keys
}


_GOOD: dict[str, st.SearchStrategy[object]] = {
    "reserve": st.sampled_from(["1GiB", "512 MiB"]), "policy": st.sampled_from(["first", "last"]),
    "split": st.booleans(), "gpu": st.sampled_from(["24 GiB", "16GiB", "1.5T", "lots"]),
    "CUDA1": st.sampled_from(["8GiB", "100"]),
    "path": st.just("m.json"), "serve_path": st.sampled_from(["/m.gguf", None]),
    "name": st.sampled_from(["llama.cpp", "ik_llama.cpp"]), "version": st.sampled_from(["b7600", None]),
    "gpus": st.lists(st.sampled_from(["CUDA0", "CUDA1", "Vulkan0"]), max_size=2),
    "n_gpu_layers": st.one_of(st.just("all"), st.integers(0, 99)), "fit": st.sampled_from([True, False, None]),
    "ctx_size": st.integers(0, 10**6), "batch": st.integers(1, 4096), "ubatch": st.integers(1, 4096),
    "flash_attn": st.sampled_from(["on", "off", "auto"]), "no_mmap": st.booleans(), "merge_qkv": st.booleans(),
    "split_mode": st.sampled_from(["layer", "graph", "row"]),
    "tensor_split": st.lists(st.one_of(st.integers(0, 3), st.floats(0, 2, allow_nan=False)), max_size=3),
    "main_gpu": st.integers(0, 3), "rpc": st.lists(st.sampled_from(["10.0.0.2:50052", "[::1]:5"]), max_size=2),
    "threads": st.integers(1, 64), "extra": st.lists(st.sampled_from(["-v", "--jinja"]), max_size=2),
    "cache_type_k": st.sampled_from(["q8_0", "f16"]), "binary": st.just("llama-server"),
    "port": st.integers(1, 65535), "docker_backend": st.sampled_from(["cpu", "cuda", "rocm"]),
    "docker_volumes": st.lists(st.just("/a:/b"), max_size=1), "compose_service": st.just("llm"),
}


@st.composite
def plan_dicts(draw: st.DrawFn) -> dict[str, object]:
    def value(key: str) -> object:
        good = _GOOD.get(key)
        return draw(good) if good is not None and draw(st.integers(0, 5)) else draw(_VALUES)

    out: dict[str, object] = {}
    if draw(st.booleans()):
        out["rules"] = draw(st.one_of(st.lists(st.just("experts -> cpu"), max_size=2), _VALUES))
    for table, keys in _KEYS.items():
        if table != "model" and draw(st.integers(0, 3)) == 0:
            continue
        sub = {k: value(k) for k in draw(st.lists(st.sampled_from(keys[:-1]), unique=True, max_size=4))}
        if draw(st.integers(0, 12)) == 0:
            sub[keys[-1]] = 1  # an unknown key
        if table == "model" and draw(st.integers(0, 8)):
            sub["path"] = "m.json"
        out[table] = sub if draw(st.integers(0, 20)) else draw(_VALUES)
    return out


@settings(max_examples=800, deadline=None)
@given(plan_dicts())
def test_validation_without_pydantic_agrees_with_pydantic(data: dict[str, object]) -> None:
    from pydantic import ValidationError

    light = validate(data)
    try:
        model = PlanModel.model_validate(data)
    except ValidationError:
        assert light is None, data
        return
    if light is not None:
        assert light.model_dump() == model.model_dump(), data


def test_validation_without_pydantic_takes_the_shipped_plans() -> None:
    for p in sorted((EXAMPLES / "plans").glob("*.toml")):
        data = tomllib.loads(p.read_text())
        light = validate(data)
        assert isinstance(light, Section), p
        assert light.model_dump() == PlanModel.model_validate(data).model_dump()
        assert light.engine.model_copy(update={"name": "x"}).name == "x"


def test_packaged_schema_is_current() -> None:
    assert plan_schema_file() == plan_schema()
