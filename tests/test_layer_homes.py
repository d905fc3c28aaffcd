"""Which layer the engines put each tensor outside `blk.N` in (moeconf.model.homes, from the
generated moeconf/model/layertable.py), and the GGUF keys read as the loaders read them: the
placement bugs of issue 24 item 0, each fed the model that showed it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moeconf.engines import engine
from moeconf.errors import GGUFError
from moeconf.explanation import explain
from moeconf.fixtures.writer import write_gguf
from moeconf.model import layertable
from moeconf.model.homes import first_block, global_home, swa_blocks
from moeconf.model.inventory import Inventory, ModelMetadata, RawTensor, build_inventory
from moeconf.model.load import load_inventory

ML = engine("llama.cpp")


def _inv(arch: str, names: list[str], blocks: int = 4, **md: Any) -> Inventory:
    raw = [RawTensor(n, "F32", (8,), 32) for n in names]
    for il in range(blocks):
        raw += [RawTensor(f"blk.{il}.attn_norm.weight", "F32", (8,), 32),
                RawTensor(f"blk.{il}.ffn_up_exps.weight", "F32", (8, 8, 4), 1024)]
    return build_inventory(ModelMetadata(arch=arch, block_count=blocks, expert_count=4, **md), raw)


def _devices(inv: Inventory, argv: list[str], gpus: list[str] | None = None) -> dict[str, str | None]:
    return explain(inv, ML, argv, gpus=gpus or ["CUDA0"]).placement.devices


def test_deepseek4_mhc_head_is_the_output_layers() -> None:
    # DeepSeek-V4: output_hc_fn/base/scale are LLM_TENSOR_LAYER_OUTPUT (src/llama-arch.cpp)
    inv = _inv("deepseek4", ["token_embd.weight", "output_norm.weight", "output.weight", "output_hc_fn.weight",
                             "output_hc_base.weight", "output_hc_scale.weight"])
    dev = _devices(inv, ["-ngl", "999"])
    for name in ("output_hc_fn.weight", "output_hc_base.weight", "output_hc_scale.weight", "output.weight"):
        assert dev[name] == "CUDA0", name
    assert dev["token_embd.weight"] == "CPU"
    # -ngl 4 of 5 layers: the output layer is offloaded first (mainline counts it), block 0 not
    dev = _devices(inv, ["-ngl", "4"])
    assert dev["output_hc_fn.weight"] == "CUDA0" and dev["blk.0.attn_norm.weight"] == "CPU"
    dev = _devices(inv, ["-ngl", "0"])
    assert dev["output_hc_fn.weight"] == "CPU"


def test_kimi_k3_output_res_score_is_the_output_layers() -> None:
    inv = _inv("kimi-k3", ["token_embd.weight", "output_norm.weight", "output.weight", "output_res_score.weight"])
    assert _devices(inv, ["-ngl", "999"])["output_res_score.weight"] == "CUDA0"


def test_lfm2_final_norm_and_tied_output_copy() -> None:
    # LFM2 names its final norm token_embd_norm (OUTPUT_NORM_LFM2, an output-layer kind) and has
    # no output_norm; its output is tied: the loader's copy of token_embd is the output layer's
    inv = _inv("lfm2moe", ["token_embd.weight", "token_embd_norm.weight"])
    ex = explain(inv, ML, ["-ngl", "999"], gpus=["CUDA0"])
    assert ex.placement.devices["token_embd_norm.weight"] == "CUDA0"
    assert ex.placement.tied_output() == "CUDA0"
    assert ex.placement.bytes_by_device()["CUDA0"] >= inv.by_name["token_embd.weight"].nbytes
    # two GPUs, -ts 1,1: the output layer is on the second
    ex = explain(inv, ML, ["-ngl", "999", "-ts", "1,1"], gpus=["CUDA0", "CUDA1"])
    assert ex.placement.devices["token_embd_norm.weight"] == "CUDA1"
    assert ex.placement.tied_output() == "CUDA1"


def test_token_embd_norm_of_bert_like_models_is_block_0s() -> None:
    # TOKEN_EMBD_NORM is a repeating kind: bloom's loader creates it on block 0 (tn(..., 0))
    inv = _inv("bloom", ["token_embd.weight", "token_embd_norm.weight", "output_norm.weight"], blocks=4)
    dev = _devices(inv, ["-ngl", "2"])  # blocks 3 and the output layer offloaded
    assert dev["token_embd_norm.weight"] == dev["blk.0.attn_norm.weight"] == "CPU"
    dev = _devices(inv, ["-ngl", "999", "-ts", "1,1"], ["CUDA0", "CUDA1"])
    assert dev["token_embd_norm.weight"] == dev["blk.0.attn_norm.weight"] == "CUDA0"


def test_rope_freqs_goes_to_the_first_full_attention_block(tmp_path: Path) -> None:
    # Gemma 4 creates rope_freqs on its first block without a sliding window (copies on the others)
    swa = [True, True, True, False, True, True, True, False]
    inv = _inv("gemma4", ["token_embd.weight", "output_norm.weight", "rope_freqs.weight"], blocks=8,
               sliding_window_pattern=tuple(int(s) for s in swa))
    dev = _devices(inv, ["-ngl", "999", "-ts", "1,1"], ["CUDA0", "CUDA1"])
    assert dev["rope_freqs.weight"] == dev["blk.3.attn_norm.weight"] == "CUDA0"
    dev = _devices(inv, ["-ngl", "999", "-ts", "1,3"], ["CUDA0", "CUDA1"])
    assert dev["rope_freqs.weight"] == dev["blk.3.attn_norm.weight"] == "CUDA1"
    assert dev["blk.0.attn_norm.weight"] == "CUDA0"
    # llama: the first block of the loop
    inv = _inv("llama", ["token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"], blocks=4)
    dev = _devices(inv, ["-ngl", "3"])
    assert dev["rope_freqs.weight"] == dev["blk.0.attn_norm.weight"] == "CPU"
    dev = _devices(inv, ["-ngl", "999"])
    assert dev["rope_freqs.weight"] == "CUDA0"


def test_global_homes_by_engine() -> None:
    assert global_home("llama.cpp", "deepseek4", "output_hc_fn.weight", ()) == "output"
    assert global_home("llama.cpp", "qwen3moe", "token_embd.weight", ()) == "input"
    assert global_home("llama.cpp", "bloom", "token_embd_norm.weight", ()) == 0
    assert global_home("llama.cpp", "lfm2moe", "token_embd_norm.weight", ()) == "output"
    # ik_llama.cpp creates bloom's token_embd_norm in its output context
    assert global_home("ik_llama.cpp", "bloom", "token_embd_norm.weight", ()) == "output"
    assert global_home("ik_llama.cpp", "llama", "rope_freqs.weight", ()) == 0
    assert global_home("llama.cpp", "gemma4", "rope_freqs.weight", (True, False, False)) == 1


def test_swa_blocks_and_guards() -> None:
    assert swa_blocks((1, 1, 0), 3) == (True, True, False)
    assert swa_blocks(None, 2) == (False, False)
    assert swa_blocks(4, 8) == (True, True, True, False, True, True, True, False)
    assert first_block("full_attention", (True, True, False)) == 2
    assert first_block("", (True,)) == 0
    with pytest.raises(ValueError, match="unknown block guard"):
        first_block("sometimes", (True,))


def test_the_table_is_the_engines() -> None:
    # spot checks of facts the generator reads (src/llama-arch.cpp LLM_TENSOR_INFOS)
    t = layertable.ML_TENSOR_LAYERS
    assert t["OUTPUT"] == t["OUTPUT_NORM"] == t["HC_HEAD_FN"] == t["OUTPUT_RES_SCORE"] == "output"
    assert t["TOKEN_EMBD"] == "input" and t["ROPE_FREQS"] == t["TOKEN_EMBD_NORM"] == "repeating"
    assert layertable.ML_BLOCK_HOMES["gemma4"]["ROPE_FREQS"] == (-1, "full_attention", True)
    assert layertable.ARRAY_KEYS["attention.head_count"] == "per_layer"
    assert layertable.ARRAY_KEYS["attention.sliding_window_pattern"] == "array"


# --- keys typed as the loaders read them ----------------------------------------------------

def _gguf(tmp_path: Path, arch: str, keys: list[tuple[str, Any]], blocks: int = 4) -> Path:
    import gguf

    kv: list[tuple[str, Any, Any]] = [(f"{arch}.block_count", blocks, gguf.GGUFValueType.UINT32),
                                      (f"{arch}.embedding_length", 8, gguf.GGUFValueType.UINT32),
                                      (f"{arch}.expert_count", 4, gguf.GGUFValueType.UINT32)]
    for k, v in keys:
        kv.append((f"{arch}.{k}", v, gguf.GGUFValueType.ARRAY if isinstance(v, list) else gguf.GGUFValueType.UINT32))
    tensors = [("token_embd.weight", "F32", (8, 16)), ("output_norm.weight", "F32", (8,))]
    for il in range(blocks):
        tensors += [(f"blk.{il}.attn_norm.weight", "F32", (8,)), (f"blk.{il}.ffn_up_exps.weight", "F32", (8, 8, 4))]
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, arch, kv, tensors)
    return path


def test_bool_array_sliding_window_pattern_is_read(tmp_path: Path) -> None:
    # the converter writes Gemma 4's and Step-3.5's pattern as bools; the loader reads it (get_arr)
    inv = load_inventory(_gguf(tmp_path, "gemma4", [("attention.sliding_window_pattern", [True, True, True, False])]))
    assert inv.metadata.sliding_window_pattern == (1, 1, 1, 0)


def test_per_layer_head_count_is_read(tmp_path: Path) -> None:
    # Laguna, Step-3.5: attention.head_count one entry per layer (get_key_or_arr)
    inv = load_inventory(_gguf(tmp_path, "step35", [("attention.head_count", [64, 96, 64, 96]),
                                                    ("expert_feed_forward_length", [0, 1280, 1280, 1280])]))
    md = inv.metadata
    assert md.head_count == 64  # the loader's n_head(): layer 0's entry
    assert md.hparam("attention.head_count") == (64, 96, 64, 96)
    assert md.expert_feed_forward_length == 0 and md.hparam("expert_feed_forward_length") == (0, 1280, 1280, 1280)


@pytest.mark.parametrize(("keys", "fragment"), [
    ([("attention.head_count", [64, 96, 64])], "has 3 entries but step35.block_count is 4"),
    ([("attention.head_count", ["a", "b", "c", "d"])], "an array holding str values"),
    ([("context_length", [1, 2, 3, 4])], "the engines read it as a single number"),
    ([("attention.sliding_window_pattern", [1.5, 0.5])], "an array holding float values"),
])
def test_bad_key_arrays_are_refused(tmp_path: Path, keys: list[tuple[str, Any]], fragment: str) -> None:
    with pytest.raises(GGUFError, match=fragment):
        load_inventory(_gguf(tmp_path, "step35", keys))


def test_ik_rope_freqs_of_gemma4_is_its_first_full_attention_blocks() -> None:
    # ik_llama.cpp creates it under `!hparams.swa_layers[i]` (src/llama-load-tensors.cpp)
    assert layertable.IK_GLOBAL_HOMES["gemma4"]["ROPE_FREQS"] == "block full_attention"
    assert global_home("ik_llama.cpp", "gemma4", "rope_freqs.weight", (True, True, False)) == 2


def test_moe_blocks_of_an_optional_router_come_from_the_tensors() -> None:
    # Jamba's converter writes no MoE period; its loader makes a block MoE where ffn_gate_inp is
    raw = [RawTensor("token_embd.weight", "F32", (8,), 32)]
    for il in range(4):
        raw.append(RawTensor(f"blk.{il}.attn_norm.weight", "F32", (8,), 32))
        raw.append(RawTensor(f"blk.{il}.ffn_up_exps.weight" if il % 2 else f"blk.{il}.ffn_up.weight", "F32", (8,), 32))
    md = ModelMetadata(arch="jamba", block_count=4, expert_count=4)
    assert build_inventory(md, raw).warnings == ()
    # the same tensors under an architecture whose metadata says every block is MoE: warned
    assert any("dense by their tensors" in w for w in build_inventory(
        ModelMetadata(arch="qwen3moe", block_count=4, expert_count=4), raw).warnings)


# --- the generator (scripts/extract-tensor-layers.py) on loader text ------------------------

def _extractor() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "extract-tensor-layers.py"
    spec = importlib.util.spec_from_file_location("extract_tensor_layers", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generator_reads_layers_and_refuses_a_guard_it_cannot_name() -> None:
    ex = _extractor()
    infos = ("static const std::map<llm_tensor, llm_tensor_info> LLM_TENSOR_INFOS = {\n"
             "    {LLM_TENSOR_OUTPUT,     {LLM_TENSOR_LAYER_OUTPUT,    GGML_OP_MUL_MAT}},\n"
             "    {LLM_TENSOR_ROPE_FREQS, {LLM_TENSOR_LAYER_REPEATING, GGML_OP_ROPE}},\n};\n")
    assert ex.tensor_layers(infos) == {"OUTPUT": "output", "ROPE_FREQS": "repeating"}
    body = ("{ for (int i = 0; i < n_layer; ++i) { if (!hparams.is_swa(i)) {"
            " x = create_tensor(tn(LLM_TENSOR_ROPE_FREQS, \"weight\", i), {4}, f); } } }")
    assert ex._guard(body, body.index("create_tensor")) == "full_attention"
    odd = body.replace("!hparams.is_swa(i)", "i % 3 == 1")
    with pytest.raises(SystemExit, match="cannot name"):
        ex._guard(odd, odd.index("create_tensor"))


def test_generator_reads_a_flag_set_only_in_the_mtp_blocks_as_required_in_the_trunk() -> None:
    # bailingmoe2, exaone-moe, exaone4, glm4: `int flags = 0; if (i >= n_layer) { flags |= TENSOR_SKIP; }`
    # before the block's create_tensor calls: 0 in a trunk block (the engine stops without the tensor: the
    # engine suite's test_required_tensors); a change of the variable outside that guard is not read
    ex = _extractor()
    head = "{ const bool is_nextn = i >= n_layer; int flags = 0; if (GUARD) { flags |= TENSOR_SKIP; } "
    call = "x = create_tensor(tn(LLM_TENSOR_ATTN_NORM, \"weight\", i), {4}, flags); }"
    for guard in ("i >= n_layer", "is_nextn"):
        body = head.replace("GUARD", guard) + call
        assert ex._trunk_flags(body, 0, body.index("x = create_tensor"), "flags") == "0"
    for other in ("i % 2 == 1", "i >= n_layer) { flags |= TENSOR_SKIP; } if (i == 3"):
        body = head.replace("GUARD", other) + call
        assert ex._trunk_flags(body, 0, body.index("x = create_tensor"), "flags") is None
    body = head.replace("GUARD", "is_nextn") + "flags = TENSOR_NOT_REQUIRED; " + call
    assert ex._trunk_flags(body, 0, body.index("x = create_tensor"), "flags") is None
