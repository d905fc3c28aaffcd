"""Names from the engines: the generated name table is fresh, real tensor names of the
architectures users run get their groups, unknown names are reported, the recurrent layer kind
shows in inspect and works in plans, and MTP tensors the loader still creates are placed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import gguf
import pytest

from moeconf.engines import engine
from moeconf.engines.cmdline import cpu_moe_pattern
from moeconf.explanation import explain
from moeconf.fixtures import write_gguf
from moeconf.model import nametable
from moeconf.model.inventory import Inventory, ModelMetadata, RawTensor, build_inventory
from moeconf.model.taxonomy import arch_tensor_kinds, classify_name
from moeconf.plan import plan_from_text
from moeconf.report.inventory import inventory_json, render_summary
from moeconf.resolve import resolve
from tests.conftest import REPO

VT = gguf.GGUFValueType
_ENGINES = Path.home() / ".cache" / "moeconf" / "engines"
ML_SRC = Path(os.environ.get("MOECONF_LLAMA_CPP_SRC", _ENGINES / "llama-cpp-python-0.3.36/src/vendor/llama.cpp"))
IK_SRC = Path(os.environ.get("MOECONF_IK_LLAMA_CPP_SRC",
                             _ENGINES / "ik-llama-cpp-python-0.1.5/src/vendor/ik_llama.cpp"))
HAVE_SOURCES = (ML_SRC / "src" / "llama-arch.cpp").exists() and (IK_SRC / "src" / "llama-arch.cpp").exists()


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("extract_engine_names", REPO / "scripts" / "extract-engine-names.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not HAVE_SOURCES,
                    reason="pinned llama.cpp / ik_llama.cpp sources absent (scripts/build-engines.sh fetches them)")
def test_nametable_is_fresh() -> None:
    """Regenerating from the pinned sources gives the committed moeconf/model/nametable.py."""
    text = _script().render(ML_SRC, IK_SRC, nametable.SOURCES["llama.cpp"], nametable.SOURCES["ik_llama.cpp"])
    assert text == (REPO / "moeconf" / "model" / "nametable.py").read_text(), \
        "stale: run scripts/extract-engine-names.py on the pinned sources"


def test_mtp_reading_on_a_loader_excerpt() -> None:
    """The MTP reading of the generator: a block-level tensor created without the variable that
    carries TENSOR_SKIP is loaded in the MTP block; one under `if (i < n_layer)` is not."""
    body = """{
        int mtp_flags = 0;
        if (!ml.load_mtp) { mtp_flags |= TENSOR_SKIP; }
        for (int i = 0; i < n_layer_all; ++i) {
            const int flags = (i >= n_layer) ? mtp_flags : 0;
            layer.a = create_tensor(tn(LLM_TENSOR_ATTN_NORM, "weight", i), {n}, flags);
            layer.b = create_tensor(tn(LLM_TENSOR_FFN_EXP_PROBS_B, "bias", i), {n}, TENSOR_NOT_REQUIRED);
            if (i < n_layer) {
                layer.c = create_tensor(tn(LLM_TENSOR_HC_ATTN_FN, "weight", i), {n}, 0);
            }
        }
    }"""
    kinds, loaded, skips = _script().loader_facts(body, {})
    assert skips and {"ATTN_NORM", "FFN_EXP_PROBS_B", "HC_ATTN_FN"} <= kinds
    assert loaded == {"FFN_EXP_PROBS_B.bias"}


def test_table_has_what_the_engines_know() -> None:
    ml = set(nametable.ARCHS["llama.cpp"])
    assert {"qwen35moe", "qwen3next", "deepseek32", "glm-dsa", "glm5-next", "nemotron_h_moe", "kimi-linear",
            "minimax-m2", "grok", "ernie4_5-moe", "hunyuan-moe", "bailingmoe2", "dots1", "qwen3vlmoe"} <= ml
    assert {"qwen35moe", "glm-dsa", "minimax-m2"} <= set(nametable.ARCHS["ik_llama.cpp"])
    for base in ("ffn_up_exps", "ffn_gate_up_exps", "indexer.k_norm", "ssm_conv1d", "hc_attn_fn", "ffn_latent_down",
                 "indexer_compressor_gate"):
        assert base in nametable.BLOCK_TENSORS, base
    assert nametable.BLOCK_TENSORS["ffn_latent_down"] == ("FFN_LATENT_DOWN",)
    # the loader facts the placement uses (src/models/deepseek32.cpp, glm-dsa.cpp: load_arch_tensors)
    assert nametable.ML_MTP_LOADED["deepseek32"] == ("exp_probs_b.bias",)
    assert nametable.ML_MTP_LOADED["glm-dsa"] == ("exp_probs_b.bias",)
    assert "glm4moe" in nametable.ML_MTP_SKIPPED and "glm4moe" not in nametable.ML_MTP_LOADED
    assert "FFN_LATENT_DOWN" in nametable.ML_ARCH_TENSORS["nemotron_h_moe"]


# Real tensor names, as the pinned llama.cpp loaders create them (src/models/<arch>.cpp,
# load_arch_tensors), and the group each must get.
REAL_NAMES: dict[str, dict[str, str]] = {
    "qwen35moe": {
        "blk.0.attn_qkv.weight": "attn", "blk.0.attn_gate.weight": "attn", "blk.0.ssm_conv1d.weight": "ssm",
        "blk.0.ssm_dt.bias": "ssm", "blk.0.ssm_a": "ssm", "blk.0.ssm_beta.weight": "ssm",
        "blk.0.ssm_alpha.weight": "ssm", "blk.0.ssm_norm.weight": "ssm", "blk.0.ssm_out.weight": "ssm",
        "blk.0.post_attention_norm.weight": "norm", "blk.0.ffn_gate_inp.weight": "router",
        "blk.0.ffn_gate_up_exps.weight": "experts", "blk.0.ffn_down_exps.weight": "experts",
        "blk.0.ffn_gate_inp_shexp.weight": "shexp", "blk.0.ffn_up_shexp.weight": "shexp",
        "blk.3.attn_q_norm.weight": "norm", "blk.40.nextn.eh_proj.weight": "nextn",
    },
    "qwen3next": {"blk.0.ssm_ba.weight": "ssm", "blk.0.ssm_conv1d.weight": "ssm", "blk.0.ffn_up_exps.weight": "experts",
                  "blk.3.attn_q.weight": "attn"},
    "deepseek32": {
        "blk.3.indexer.k_norm.weight": "norm", "blk.3.indexer.k_norm.bias": "norm", "blk.3.indexer.proj.weight": "attn",
        "blk.3.indexer.attn_k.weight": "attn", "blk.3.indexer.attn_q_b.weight": "attn",
        "blk.3.attn_k_b.weight": "attn", "blk.3.attn_v_b.weight": "attn", "blk.3.exp_probs_b.bias": "router",
        "blk.3.attn_kv_a_mqa.weight": "attn", "blk.61.nextn.shared_head_head.weight": "nextn",
    },
    "glm-dsa": {"blk.3.indexer.attn_q_b.weight": "attn", "blk.3.exp_probs_b.bias": "router",
                "blk.3.ffn_gate_shexp.weight": "shexp"},
    "glm5-next": {
        "blk.1.hc_attn_fn.weight": "hc", "blk.1.hc_attn_base.weight": "hc", "blk.1.hc_ffn_scale.weight": "hc",
        "blk.1.indexer_compressor_gate.weight": "attn", "blk.1.indexer_compressor_ape.weight": "attn",
        "blk.0.ssm_conv1d_q.weight": "ssm", "blk.0.ssm_f_a.weight": "ssm", "blk.0.ssm_g_b.weight": "ssm",
        "blk.0.ssm_a": "ssm", "blk.1.attn_q_a.weight": "attn",
    },
    "nemotron_h_moe": {
        "blk.1.ffn_latent_down.weight": "dense", "blk.1.ffn_latent_up.weight": "dense",
        "blk.1.ffn_up_exps.weight": "experts", "blk.1.ffn_down_exps.weight": "experts",
        "blk.1.exp_probs_b.bias": "router", "blk.0.ssm_in.weight": "ssm", "blk.0.ssm_d": "ssm",
        "blk.0.ssm_conv1d.bias": "ssm",
    },
    "kimi-linear": {"blk.0.ssm_conv1d_k.weight": "ssm", "blk.0.ssm_f_b.weight": "ssm", "blk.0.ssm_g_a.weight": "ssm",
                    "blk.3.attn_kv_a_mqa.weight": "attn", "blk.1.ffn_gate_exps.weight": "experts"},
    "minimax-m2": {"blk.0.attn_q_norm.weight": "norm", "blk.0.exp_probs_b.bias": "router",
                   "blk.0.ffn_gate_exps.weight": "experts"},
    "grok": {"blk.0.attn_output_norm.weight": "norm", "blk.0.layer_output_norm.weight": "norm",
             "blk.0.ffn_gate_exps.weight": "experts", "blk.0.ffn_up.weight": "dense"},
    "ernie4_5-moe": {"blk.0.ffn_gate.weight": "dense", "blk.1.exp_probs_b.bias": "router",
                     "blk.1.ffn_down_shexp.weight": "shexp", "blk.1.ffn_up_exps.weight": "experts"},
    "hunyuan-moe": {"blk.0.attn_k_norm.weight": "norm", "blk.0.ffn_gate_inp.weight": "router",
                    "blk.0.ffn_up_shexp.weight": "shexp", "blk.0.ffn_down_exps.weight": "experts"},
    "bailingmoe2": {"blk.1.exp_probs_b.bias": "router", "blk.1.attn_qkv.weight": "attn",
                    "blk.20.nextn.eh_proj.weight": "nextn"},
    "dots1": {"blk.1.exp_probs_b.bias": "router", "blk.1.ffn_gate_shexp.weight": "shexp"},
    "qwen3vlmoe": {"blk.0.ffn_gate_inp.weight": "router", "blk.0.ffn_up_exps.weight": "experts",
                   "blk.0.attn_k_norm.weight": "norm"},
}


@pytest.mark.parametrize("arch", sorted(REAL_NAMES))
def test_real_names_get_their_groups(arch: str) -> None:
    kinds = arch_tensor_kinds("llama.cpp", arch)
    assert kinds is not None
    for name, group in REAL_NAMES[arch].items():
        k = classify_name(name)
        assert k.known, name
        assert k.group == group, (arch, name, k)
        assert set(k.kinds) & kinds, f"{arch}'s loader does not create {name} ({k.kinds})"


def _inv(arch: str, blocks: dict[int, list[str]], top: tuple[str, ...] = ("token_embd.weight", "output.weight"),
         **md: int) -> Inventory:
    raw = [RawTensor(n, "F32", (8,), 32) for n in top]
    for il, bases in blocks.items():
        raw += [RawTensor(f"blk.{il}.{b}", "F32", (8,), 32) for b in bases]
    return build_inventory(ModelMetadata(arch=arch, block_count=len(blocks), expert_count=4, expert_used_count=2, **md),
                           raw)


_QWEN35_RECR = ["attn_norm.weight", "attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a",
                "ssm_beta.weight", "ssm_alpha.weight", "ssm_norm.weight", "ssm_out.weight", "ffn_gate_inp.weight",
                "ffn_gate_up_exps.weight", "ffn_down_exps.weight"]
_QWEN35_ATTN = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                "ffn_gate_inp.weight", "ffn_gate_up_exps.weight", "ffn_down_exps.weight"]


def _qwen35() -> Inventory:
    return _inv("qwen35moe", {0: _QWEN35_RECR, 1: _QWEN35_RECR, 2: _QWEN35_RECR, 3: _QWEN35_ATTN})


def test_recurrent_layer_kind_in_inventory_and_inspect() -> None:
    inv = _qwen35()
    assert inv.layers_of_kind("recurrent") == [0, 1, 2]
    assert inv.layers_of_kind("moe") == [0, 1, 2, 3]  # the FFN kind is unchanged
    text = render_summary(inv)
    assert "4 blocks: moe 0-3, recurrent 0-2" in text
    data = inventory_json(inv)
    assert [la["recurrent"] for la in data["layers"]] == [True, True, True, False]
    # MiniMax-01's lightning-attention layers are recurrent by their attn_norm_2
    mm = _inv("minimax-01", {0: ["attn_norm.weight", "attn_norm_2.weight", "attn_qkv.weight"],
                             1: ["attn_norm.weight", "attn_q.weight"]})
    assert mm.layers_of_kind("recurrent") == [0]


def test_recurrent_layer_kind_in_a_plan() -> None:
    inv = _qwen35()
    text = ('rules = ["experts -> cpu", "experts layers recurrent -> gpu", "layers recurrent -> gpu"]\n'
            '[model]\npath = "/m.manifest.json"\nserve_path = "/m.gguf"\n[flags]\nn_gpu_layers = 0\n')
    plan = plan_from_text(text, "/tmp/p.toml")
    devs = resolve(plan, inv).placement.devices
    assert devs["blk.0.ffn_down_exps.weight"] == "CUDA0" and devs["blk.2.ssm_out.weight"] == "CUDA0"
    assert devs["blk.3.ffn_down_exps.weight"] == "CPU"  # the attention layer's experts stay on the CPU
    assert devs["blk.3.attn_q.weight"] == "CPU"  # -ngl 0 and no rule for layer 3


def test_unknown_names_are_reported_by_inspect(tmp_path: Path) -> None:
    p = tmp_path / "u.gguf"
    write_gguf(p, "qwen35moe", [("qwen35moe.block_count", 1, VT.UINT32)],
               [("blk.0.attn_norm.weight", "F32", (8,)), ("blk.0.ssm_frobnicate.weight", "F32", (8,)),
                ("blk.0.hc_attn_fn.weight", "F32", (8,))])
    r = subprocess.run([sys.executable, "-m", "moeconf", "inspect", str(p)], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "unknown tensors (1, no pinned engine knows them" in r.stdout
    assert "  blk.0.ssm_frobnicate.weight" in r.stdout
    assert re.search(r"^hc\s+1\b", r.stdout, re.M)  # an mHC tensor the engine knows is in its group
    r = subprocess.run([sys.executable, "-m", "moeconf", "inspect", str(p), "--json"], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert json.loads(r.stdout)["unknown_tensors"] == ["blk.0.ssm_frobnicate.weight"]


def _dsa(arch: str) -> Inventory:
    moe = ["attn_norm.weight", "attn_q_a.weight", "indexer.proj.weight", "ffn_gate_inp.weight", "exp_probs_b.bias",
           "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_gate_exps.weight"]
    return _inv(arch, {0: moe, 1: moe, 2: [*moe, "nextn.eh_proj.weight", "nextn.enorm.weight"]},
                nextn_predict_layers=1)


@pytest.mark.parametrize("arch", ["deepseek32", "glm-dsa"])
def test_mtp_exp_probs_b_is_loaded_on_its_layer_device(arch: str) -> None:
    """deepseek32 and glm-dsa create the MTP block's exp_probs_b without the skip flag: mainline
    loads it on the layer's device; the block's other tensors are not loaded."""
    inv = _dsa(arch)
    ex = explain(inv, engine("llama.cpp"), ["llama-server", "-m", "/m.gguf", "-ngl", "99"], gpus=["CUDA0"])
    devs = ex.placement.devices
    assert devs["blk.2.exp_probs_b.bias"] == "CUDA0"
    assert devs["blk.2.ffn_up_exps.weight"] is None and devs["blk.2.nextn.eh_proj.weight"] is None
    assert devs["blk.1.exp_probs_b.bias"] == "CUDA0"
    # ik_llama.cpp 0.1.5 creates every tensor of a glm-dsa MTP block with the skip flag
    ik = explain(inv, engine("ik_llama.cpp", "0.1.5"), ["llama-server", "-m", "/m.gguf", "-ngl", "99"], gpus=["CUDA0"])
    assert ik.placement.devices["blk.2.exp_probs_b.bias"] is None


def test_glm4moe_mtp_block_stays_unloaded() -> None:
    inv = _inv("glm4moe", {0: ["attn_norm.weight", "exp_probs_b.bias", "ffn_up_exps.weight"],
                           1: ["attn_norm.weight", "exp_probs_b.bias", "ffn_up_exps.weight", "nextn.eh_proj.weight"]},
               nextn_predict_layers=1)
    ex = explain(inv, engine("llama.cpp"), ["llama-server", "-m", "/m.gguf", "-ngl", "99"], gpus=["CUDA0"])
    assert ex.placement.devices["blk.1.exp_probs_b.bias"] is None


def _source_patterns() -> tuple[str, str]:
    common_h = (ML_SRC / "common" / "common.h").read_text()
    ml = re.search(r'LLM_FFN_EXPS_REGEX\s*=\s*"([^"]+)"', common_h)
    ik_src = (IK_SRC / "src" / "llama-load-tensors.cpp").read_text()
    ik = re.search(r'"blk\\\\\." \+ std::to_string\(i\) \+ "([^"]+)"', ik_src)
    assert ml and ik
    return ml.group(1).replace("\\\\", "\\"), ik.group(1).replace("\\\\", "\\")


@pytest.mark.skipif(not HAVE_SOURCES, reason="pinned engine sources absent")
def test_cpu_moe_patterns_are_the_engines() -> None:
    """--cpu-moe / --n-cpu-moe as moeconf writes them match exactly the tensors the engines' own
    patterns match, over every expert-like name the engines know (fused, chunked, per-expert, with
    .weight/.bias/.scale)."""
    ml_body, ik_tail = _source_patterns()
    names = [f"blk.7.{b.format(xid=2)}{suf}" for b in nametable.BLOCK_TENSORS if b.startswith("ffn")
             for suf in (".weight", ".bias", ".scale")]
    for pattern, ours in ((ml_body, cpu_moe_pattern(engine("llama.cpp"))),
                          (r"blk\.7" + ml_body, cpu_moe_pattern(engine("llama.cpp"), 7)),
                          (r"blk\.7" + ik_tail, cpu_moe_pattern(engine("ik_llama.cpp", "0.1.5"), 7))):
        theirs = [n for n in names if re.search(pattern, n)]
        assert [n for n in names if re.search(ours, n)] == theirs, (pattern, ours)
        assert "blk.7.ffn_gate_up_exps.weight" in theirs


def test_names_the_arch_loader_does_not_create_are_warned() -> None:
    """A known name whose kind the architecture's loader never creates (a delta-net tensor in a
    qwen3moe file) is named in a warning: the engines refuse such a file."""
    inv = _inv("qwen3moe", {0: ["attn_norm.weight", "ffn_up_exps.weight", "ssm_conv1d.weight"]})
    (w,) = [w for w in inv.warnings if "loader does not create" in w]
    assert "blk.0.ssm_conv1d.weight" in w and "ffn_up_exps" not in w
    assert not [w for w in _qwen35().warnings if "loader does not create" in w]
    unknown_arch = _inv("frobnimoe", {0: ["attn_norm.weight"]})
    assert any("architecture 'frobnimoe' is unknown to the pinned engines" in w for w in unknown_arch.warnings)


def test_mtp_block_is_picked_by_index_where_the_loader_does() -> None:
    """qwen35moe's loader skips the last nextn_predict_layers blocks by index, whatever their
    tensors: a last block without nextn.* names is still not loaded."""
    inv = _inv("qwen35moe", {0: _QWEN35_RECR, 1: _QWEN35_ATTN, 2: _QWEN35_ATTN}, nextn_predict_layers=1)
    ex = explain(inv, engine("llama.cpp"), ["llama-server", "-m", "/m.gguf", "-ngl", "99"], gpus=["CUDA0"])
    assert ex.placement.devices["blk.2.attn_q.weight"] is None
    assert ex.placement.devices["blk.1.attn_q.weight"] == "CUDA0"


def test_kinds_mainline_never_loads_are_not_placed() -> None:
    """masked_embd_* have no op in mainline's LLM_TENSOR_INFOS: created as unused, never placed."""
    inv = _inv("qwen3moe", {0: ["attn_norm.weight", "ffn_up_exps.weight"]},
               top=("token_embd.weight", "output.weight", "masked_embd_centroids.weight"))
    ex = explain(inv, engine("llama.cpp"), ["llama-server", "-m", "/m.gguf", "-ngl", "99"], gpus=["CUDA0"])
    assert ex.placement.devices["masked_embd_centroids.weight"] is None
    assert ex.placement.devices["token_embd.weight"] == "CPU"


def test_ik_loaders_follow_their_helpers_and_has_norm() -> None:
    """ik_llama.cpp's loaders create the embeddings and the head through create_embd_output (its has_norm argument
    false: no output_norm, as olmo's); a table without them would make every ik file "never created"."""
    src = """
    void create_tensors_helper::create_embd_output(const LLM_TN & tn, int n_embd, int n_vocab, bool has_norm) {
        model.tok_embd = create_tensor(ctx_input, tn(LLM_TENSOR_TOKEN_EMBD, "weight"), {n_embd, n_vocab});
        if (has_norm) { model.output_norm = create_tensor(ctx_output, tn(LLM_TENSOR_OUTPUT_NORM, "weight"), {n_embd}); }
        model.output = create_tensor(ctx_output, tn(LLM_TENSOR_OUTPUT, "weight"), {n_embd, n_vocab}, 0);
    }
    bool create_tensors_helper::create_a_tensors(const LLM_TN & tn) {
        create_embd_output(tn, n_embd, n_vocab);
        return true;
    }
    bool create_tensors_helper::create_b_tensors(const LLM_TN & tn) {
        create_embd_output(tn, n_embd, n_vocab, false);
        return true;
    }
    bool create_tensors_helper::create_tensors() {
        switch (model.arch) {
            case LLM_ARCH_A: create_a_tensors(tn); break;
            case LLM_ARCH_B: create_b_tensors(tn); break;
        }
    }
    """
    got = _script().ik_arch_loaders(src, {"A": "a", "B": "b"})
    assert got["a"][0] == {"TOKEN_EMBD", "OUTPUT_NORM", "OUTPUT"}
    assert got["b"][0] == {"TOKEN_EMBD", "OUTPUT"}
