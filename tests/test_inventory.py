"""Inventories: layer kinds, groups, split models and manifests for the realistic layouts."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import gguf
import jsonschema
import pytest

from moeconf.errors import GGUFError, ManifestError, MoeconfError
from moeconf.fixtures import LAYOUTS, write_gguf, write_layout
from moeconf.model import nametable
from moeconf.model.inventory import format_ranges
from moeconf.model.load import load_inventory
from moeconf.model.manifest import dumps_manifest, read_manifest, write_manifest
from moeconf.model.taxonomy import GROUPS, classify_name, group_of_kind, moe_architectures
from tests.conftest import REPO

VT = gguf.GGUFValueType

EXPECTED_KINDS = {
    # key: (dense layers, moe layers, nextn layers)
    "deepseek-v3": ("0-2", "3-60", "none"),
    "kimi-k2": ("0", "1-60", "none"),
    "glm-4.5": ("0-2", "3-91", "92"),
    "glm-4.5-air": ("0", "1-45", "46"),
    "qwen3-30b-a3b": ("none", "0-47", "none"),
    "qwen3-235b-a22b": ("none", "0-93", "none"),
    "gpt-oss-120b": ("none", "0-35", "none"),
    "gpt-oss-20b": ("none", "0-23", "none"),
    "llama-4-maverick": (
        format_ranges(range(0, 48, 2)), format_ranges(range(1, 48, 2)), "none",
    ),

    "ernie-4.5-21b-a3b": ("0", "1-27", "none"),
    "hunyuan-a13b": ("none", "0-31", "none"),
    "ling-mini-2.0": ("0", "1-19", "20"),
    "dots.llm1": ("0", "1-61", "none"),
    "qwen3-vl-30b-a3b": ("none", "0-47", "none"),
    # every layer of the hybrids is MoE (recurrent or attention)
    "qwen3.5-397b-a17b": ("none", "0-59", "none"),
    "qwen3.5-122b-a10b": ("none", "0-47", "none"),
    "qwen3.5-35b-a3b": ("none", "0-39", "none"),
    "qwen3-next-80b-a3b": ("none", "0-47", "none"),

    "deepseek-v3.2": ("0-2", "3-60", "61"),
    "glm-5": ("0-2", "3-77", "78"),
    "minimax-m2": ("none", "0-61", "none"),
    "grok-1": ("none", "0-63", "none"),
    # Nemotron-3's Mamba-2 and attention layers have no FFN (dense: no experts)
    "nemotron-3-nano-30b-a3b": ("0, 2, 4-5, 7, 9, 11-12, 14, 16, 18-19, 21, 23, 25-26, 28, 30, 32-33, 35, 37, 39, "
                                "41-42, 44, 46, 48, 50",
                                "1, 3, 6, 8, 10, 13, 15, 17, 20, 22, 24, 27, 29, 31, 34, 36, 38, 40, 43, 45, 47, "
                                "49, 51",
                                "none"),
    # Super: its hybrid_override_pattern's E layers are MoE, the M and * layers dense
    "nemotron-3-super-120b-a12b": (
        "0, 2, 4, 6-7, 9, 11, 13, 15-16, 18, 20, 22, 24-25, 27, 29, 31, 33, 35-36, 38, 40, 42, 44, 46-47, 49, 51, "
        "53, 55, 57-58, 60, 62, 64, 66, 68-69, 71, 73, 75, 77-78, 80, 82, 84, 86",
        "1, 3, 5, 8, 10, 12, 14, 17, 19, 21, 23, 26, 28, 30, 32, 34, 37, 39, 41, 43, 45, 48, 50, 52, 54, 56, 59, 61, "
        "63, 65, 67, 70, 72, 74, 76, 79, 81, 83, 85, 87",
        "none"),
    "kimi-linear-48b-a3b": ("0", "1-26", "none"),
    "glm-5.3-flash": ("0-2", "3-44", "45"),
    # issue 17 item 6 (layouts_flagship.py)
    "kimi-k2.5": ("0", "1-60", "none"),
    "qwen3-coder-480b-a35b": ("none", "0-61", "none"),
    "glm-4.7": ("0-2", "3-91", "92"),
    # issue 24 (layouts_loaders.py): their loaders' dense leads and MTP blocks
    "deepseek-v4-flash": ("none", "0-42", "43"),
    "deepseek-v4-pro": ("none", "0-60", "61"),
    "kimi-k3": ("0", "1-92", "none"),
    "lfm2-8b-a1b": ("0-1", "2-23", "none"),
    "gemma-4-26b-a4b": ("none", "0-29", "none"),
    "step-3.5-flash": ("0-2", "3-44", "none"),
    "laguna-xs.2": ("0", "1-39", "none"),
    **{k: ("none", f"0-{n - 1}", "none") for k, n in (
        ("mixtral-8x7b", 32), ("qwen1.5-moe-a2.7b", 24), ("olmoe-1b-7b", 16), ("phi-3.5-moe", 32), ("dbrx", 40),
        ("snowflake-arctic", 35), ("granite-3.1-3b-a800m", 32), ("smallthinker-4ba0.6b", 32), ("ling-lite-1.5", 28),
        ("minicpm-moe-8x2b", 40), ("granite-synthetic-moe", 40), ("mistral3-synthetic-moe", 40),
        ("refact-synthetic-moe", 32), ("mellum2-12b-a2.5b", 28), ("maple-preview", 24),
        ("granite-swash-3b-a600m", 32))},
    "deepseek-moe-16b": ("0", "1-27", "none"),
    "trinity-mini": ("0-1", "2-31", "none"),
    "k-exaone-236b-a23b": ("0", "1-47", "48"),
    "mimo-v2-flash": ("0", "1-47", "48"),
    "hy3-preview": ("0", "1-79", "80"),
    "mistral-small-4": ("none", "0-35", "none"),
    "cohere2moe-30b-a3b": ("0", "1-48", "none"),
    "minimax-m3": ("0", "1-59", "none"),
    "ling-3.0-flash": ("0-1", "2-41", "42"),
    "dots3-note-prev": ("0", "1-45", "none"),
    "granite-4.0-h-small": ("none", "0-39", "none"),
    # Jamba: experts on every second block, as its tensors say (the converter writes no period)
    "jamba-mini-1.5": (format_ranges(range(0, 32, 2)), format_ranges(range(1, 32, 2)), "none"),
    "grovemoe-inst": ("none", "0-47", "none"),
    "minimax-text-01": ("none", "0-79", "none"),
}
EXPECTED_KINDS["hy4-preview"] = ("0", "1-77", "none")
EXPECTED_KINDS["qwen3.8-flash-next"] = ("none", "0-47", "none")
# the architectures llama-server does not serve (memory "not applicable"), placement checked all the same
EXPECTED_KINDS.update({
    "llada-moe-7b-a1b": ("none", "0-15", "none"), "rnd1-base-0910": ("none", "0-47", "none"),
    "nomic-embed-text-v2-moe": ("0, 2, 4, 6, 8, 10", "1, 3, 5, 7, 9, 11", "none"),
    "deepseek-ocr": ("0", "1-11", "none"), "llama-embed-synthetic-moe": ("none", "0-31", "none"),
    "deepseek-v4-flash-dspark": ("none", "0-1", "none"),
})
# Nemotron-3-Nano's config written as `nemotron_h` (synthetic: the loader the two share)
EXPECTED_KINDS["nemotron-h-synthetic-moe"] = EXPECTED_KINDS["nemotron-3-nano-30b-a3b"]


@pytest.mark.parametrize("key", sorted(LAYOUTS))
def test_layer_kinds(layout_paths: dict[str, Path], key: str) -> None:
    inv = load_inventory(layout_paths[key])
    assert inv.warnings == ()
    got = tuple(format_ranges(inv.layers_of_kind(k)) for k in ("dense", "moe", "nextn"))
    assert got == EXPECTED_KINDS[key]
    assert inv.block_count == LAYOUTS[key].blocks
    assert len(inv.layers) == inv.block_count


def test_groups_deepseek(layout_paths: dict[str, Path]) -> None:
    inv = load_inventory(layout_paths["deepseek-v3"])
    g = {t.name: t.group for t in inv.tensors}
    assert g["blk.3.ffn_up_exps.weight"] == "experts"
    assert g["blk.3.ffn_down_shexp.weight"] == "shexp"
    assert g["blk.3.ffn_gate_inp.weight"] == "router"
    assert g["blk.3.exp_probs_b.bias"] == "router"
    assert g["blk.3.attn_kv_a_mqa.weight"] == "attn"
    assert g["blk.3.attn_k_b.weight"] == "attn"
    assert g["blk.0.ffn_up.weight"] == "dense"
    assert g["blk.0.attn_q_a_norm.weight"] == "norm"
    assert g["token_embd.weight"] == "embd"
    assert g["output.weight"] == "output"
    assert g["output_norm.weight"] == "norm"
    t = inv.by_name["blk.3.ffn_up_exps.weight"]
    assert t.shape == (7168, 2048, 256)
    assert t.type == "Q4_K"
    assert t.nbytes == 7168 // 256 * 144 * 2048 * 256
    assert t.layer == 3
    assert t.base == "ffn_up_exps"
    assert inv.by_name["token_embd.weight"].layer is None


def test_nextn_block_glm_air(layout_paths: dict[str, Path]) -> None:
    inv = load_inventory(layout_paths["glm-4.5-air"])
    block = [t for t in inv.tensors if t.layer == 46]
    assert {t.group for t in block} == {"nextn"}
    roles = {t.base: t.role for t in block}
    assert roles["ffn_up_exps"] == "experts"
    assert roles["nextn.eh_proj"] == "nextn"
    assert roles["attn_q"] == "attn"
    assert inv.layers_with("experts") == list(range(1, 47))


def test_gpt_oss_expert_biases(layout_paths: dict[str, Path]) -> None:
    inv = load_inventory(layout_paths["gpt-oss-120b"])
    t = inv.by_name["blk.0.ffn_down_exps.bias"]
    assert (t.group, t.type, t.shape) == ("experts", "F32", (2880, 128))
    assert inv.by_name["blk.0.ffn_up_exps.weight"].type == "MXFP4"
    assert inv.by_name["blk.0.ffn_gate_inp.bias"].group == "router"
    assert inv.by_name["blk.0.attn_sinks.weight"].group == "attn"


def test_qwen3_attn_v_types_differ(layout_paths: dict[str, Path]) -> None:
    inv = load_inventory(layout_paths["qwen3-30b-a3b"])
    v = {t.layer: t.type for t in inv.tensors if t.base == "attn_v"}
    q = {t.layer: t.type for t in inv.tensors if t.base == "attn_q"}
    differ = [il for il in v if v[il] != q[il]]
    assert 0 in differ and 47 in differ and 10 not in differ


def test_taxonomy_covers_every_moe_architecture() -> None:
    """Every tensor kind the pinned engines' loaders create for an MoE architecture has a name the
    taxonomy knows, in the group of its kind (names from moeconf.model.nametable, generated from the
    engines' sources)."""
    archs = moe_architectures()
    assert {"deepseek2", "glm4moe", "qwen3moe", "gpt-oss", "llama4", "qwen3next", "qwen35moe", "glm-dsa",
            "glm5-next", "nemotron_h_moe", "kimi-linear", "minimax-m2", "deepseek32"} <= set(archs)
    template_of = {k: n for n, ks in nametable.BLOCK_TENSORS.items() for k in ks}
    top_of = {k: n for n, ks in nametable.GLOBAL_TENSORS.items() for k in ks}
    checked = 0
    for table in (nametable.ML_ARCH_TENSORS, nametable.IK_ARCH_TENSORS):
        for arch in archs:
            for kind in table.get(arch, ()):
                if kind in template_of:
                    name = f"blk.7.{template_of[kind].format(xid=3)}.weight"
                elif kind in top_of and "{" not in top_of[kind]:
                    name = top_of[kind] + ".weight"
                else:
                    continue
                k = classify_name(name)
                assert k.known, (arch, kind, name)
                assert k.group in GROUPS
                assert kind in k.kinds or k.group == group_of_kind(kind), (arch, kind, name)
                if name.startswith("blk."):
                    assert k.layer == 7
                checked += 1
    assert checked > 1000
    assert group_of_kind("FFN_GATE_UP_EXPS") == "experts"
    assert group_of_kind("FFN_DOWN_CHEXPS") == "experts"
    assert group_of_kind("FFN_GATE_INP_SHEXP") == "shexp"
    assert group_of_kind("SSM_CONV1D") == "ssm"
    assert group_of_kind("ATTN_KV_A_MQA") == "attn"
    assert group_of_kind("NEXTN_EH_PROJ") == "nextn"


def test_unknown_names_warn(tmp_path: Path) -> None:
    p = tmp_path / "u.gguf"
    write_gguf(p, "qwen3moe", [("qwen3moe.block_count", 1, VT.UINT32)],
               [("blk.0.attn_norm.weight", "F32", (8,)), ("blk.0.mystery.weight", "F32", (8,)),
                ("weird_global", "F32", (8,))])
    inv = load_inventory(p)
    assert inv.by_name["blk.0.mystery.weight"].group == "other"
    assert inv.by_name["weird_global"].layer is None
    assert any("2 tensor name(s) unknown" in w and "blk.0.mystery.weight" in w for w in inv.warnings)
    assert inv.unknown_tensors == ("blk.0.mystery.weight", "weird_global")
    assert not inv.by_name["blk.0.mystery.weight"].known and inv.by_name["blk.0.attn_norm.weight"].known


def test_metadata_disagreement_is_a_warning(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    kv = [("qwen3moe.block_count", 3, VT.UINT32), ("qwen3moe.expert_count", 4, VT.UINT32),
          ("qwen3moe.leading_dense_block_count", 2, VT.UINT32)]
    ts = []
    for il in range(3):
        ts.append((f"blk.{il}.attn_norm.weight", "F32", (8,)))
        ts.append((f"blk.{il}.ffn_up_exps.weight", "F32", (8, 4, 4)))
    write_gguf(p, "qwen3moe", kv, ts)
    inv = load_inventory(p)
    assert inv.layers_of_kind("moe") == [0, 1, 2]
    assert any("layers 0-1 are moe by their tensors but dense by the metadata" in w for w in inv.warnings)


# --- split models ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split_model(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("split")
    return write_layout(LAYOUTS["glm-4.5-air"], d / "GLM-4.5-Air-Q4_K_M.gguf", split_max_tensors=250, vocab=500)


def test_split_reads_every_shard(split_model: list[Path], layout_paths: dict[str, Path]) -> None:
    assert split_model[0].name == "GLM-4.5-Air-Q4_K_M-00001-of-00004.gguf"
    inv = load_inventory(split_model[0])
    whole = load_inventory(layout_paths["glm-4.5-air"])
    assert len(inv.shards) == 4
    assert inv.tensors == whole.tensors
    assert inv.metadata.vocab_size == 500  # the split copy was written with a small vocabulary
    # same facts, whatever the files
    assert inv == dataclasses.replace(whole, metadata=dataclasses.replace(whole.metadata, vocab_size=500))
    # any shard leads to the whole model
    assert load_inventory(split_model[2]) == inv


def _copy(paths: list[Path], dest: Path) -> list[Path]:
    """Copy sparse shards: the header bytes for real, the data region as a hole."""
    dest.mkdir()
    out = []
    for p in paths:
        q = dest / p.name
        size = p.stat().st_size
        with open(p, "rb") as src, open(q, "wb") as dst:
            dst.write(src.read(1 << 20))
            dst.truncate(size)
        out.append(q)
    return out


def test_split_missing_shard(split_model: list[Path], tmp_path: Path) -> None:
    files = _copy(split_model, tmp_path / "m")
    os.unlink(files[2])
    with pytest.raises(GGUFError, match="shard 3 of 4 is missing") as ei:
        load_inventory(files[0])
    assert str(files[2]) in str(ei.value)


def test_split_missing_first_shard(split_model: list[Path], tmp_path: Path) -> None:
    files = _copy(split_model, tmp_path / "m")
    os.unlink(files[0])
    with pytest.raises(GGUFError, match="first shard is missing"):
        load_inventory(files[1])


def test_split_mismatched_shard(split_model: list[Path], tmp_path: Path) -> None:
    files = _copy(split_model, tmp_path / "m")
    os.unlink(files[1])
    _copy([files[2]], tmp_path / "other")[0].rename(files[1])
    with pytest.raises(GGUFError, match=r"expected split\.no 1 of split\.count 4, found split\.no 2") as ei:
        load_inventory(files[0])
    assert str(files[1]) in str(ei.value)


def test_split_renamed_first_shard(split_model: list[Path], tmp_path: Path) -> None:
    files = _copy(split_model, tmp_path / "m")
    renamed = tmp_path / "m" / "model.gguf"
    files[0].rename(renamed)
    with pytest.raises(GGUFError, match=r"split\.count is 4"):
        load_inventory(renamed)


def test_split_tensor_count_mismatch(tmp_path: Path) -> None:
    files = write_gguf(
        tmp_path / "x.gguf", "qwen3moe", [("qwen3moe.block_count", 1, VT.UINT32)],
        [("blk.0.attn_norm.weight", "F32", (8,)), ("blk.0.ffn_norm.weight", "F32", (8,))],
        split_max_tensors=1,
    )
    # rewrite shard 1's split.tensors.count (INT32) from 2 to 3 in place
    data = bytearray(files[0].read_bytes())
    key = b"split.tensors.count"
    at = data.index(key) + len(key) + 4
    data[at : at + 4] = (3).to_bytes(4, "little")
    files[0].write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=r"split\.tensors\.count is 3 but the 2 shards hold 2 tensors"):
        load_inventory(files[0])


# --- manifests ------------------------------------------------------------------------------


def _schema(name: str) -> dict[str, object]:
    return json.loads((REPO / "schemas" / name).read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("key", sorted(LAYOUTS))
def test_manifest_roundtrip(layout_paths: dict[str, Path], tmp_path: Path, key: str) -> None:
    inv = load_inventory(layout_paths[key])
    out = tmp_path / f"{key}.json"
    write_manifest(inv, out)
    data = json.loads(out.read_text())
    jsonschema.validate(data, _schema("manifest.schema.json"))
    back = load_inventory(out)
    assert back == inv
    assert back.tensors == inv.tensors
    assert back.metadata == inv.metadata


def test_manifest_is_one_tensor_a_line(layout_paths: dict[str, Path]) -> None:
    text = dumps_manifest(load_inventory(layout_paths["qwen3-30b-a3b"]))
    lines = text.splitlines()
    assert sum(1 for line in lines if line.startswith('    {"name": ')) == 579


def test_shipped_examples_match_fixtures(layout_paths: dict[str, Path]) -> None:
    shipped = sorted((REPO / "examples" / "models").glob("*.manifest.json"))
    assert len(shipped) >= 6
    for path in shipped:
        key = path.name.removesuffix(".manifest.json")
        jsonschema.validate(json.loads(path.read_text()), _schema("manifest.schema.json"))
        assert read_manifest(path) == load_inventory(layout_paths[key]), (
            f"{path} is stale: regenerate with `python -m moeconf.fixtures.regenerate`"
        )


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.update(format="x"), "format: expected 'moeconf-manifest'"),
        (lambda d: d.update(version=9), "unsupported manifest version 9"),
        (lambda d: d["metadata"].update(block_count=-1), "metadata.block_count: expected an integer >= 0"),
        (lambda d: d["metadata"].update(colour="red"), "metadata.colour: unknown key"),
        (lambda d: d["tensors"][0].update(type="Q9_Z"), 'unknown ggml type "Q9_Z"'),
        (lambda d: d["tensors"][0].update(nbytes=1), "disagrees with"),
        (lambda d: d["tensors"][0].update(shape=[]), "expected 1 to 4 dimensions"),
        (lambda d: d["tensors"].append(dict(d["tensors"][0])), "appears twice"),
        (lambda d: d["tensors"][1].update(shape=[100, 3], type="Q4_K"), "not a multiple of the block size 256"),
    ],
)
def test_bad_manifests(layout_paths: dict[str, Path], tmp_path: Path, mutate: object, fragment: str) -> None:
    inv = load_inventory(layout_paths["qwen3-30b-a3b"])
    data = json.loads(dumps_manifest(inv))
    mutate(data)  # type: ignore[operator]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ManifestError) as ei:
        load_inventory(p)
    assert fragment in str(ei.value)
    assert str(p) in str(ei.value)


def test_manifest_json_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{\n  "format": "moeconf-manifest",\n  "version": 1,,\n}')
    with pytest.raises(ManifestError) as ei:
        load_inventory(p)
    assert f"{p}:3:16: invalid JSON" in str(ei.value)


def test_load_inventory_errors(tmp_path: Path) -> None:
    with pytest.raises(MoeconfError, match="no such file"):
        load_inventory(tmp_path / "missing.gguf")
    with pytest.raises(MoeconfError, match="is a directory"):
        load_inventory(tmp_path)
