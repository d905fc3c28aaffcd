"""Layouts placed against llama.cpp whose memory moeconf refused when they were added, as sparse full-size
layouts (moeconf/fixtures/layouts_loaders.py; placement compared with the engine's in
tests/engine/test_placement_homes.py). Every tensor is one the engine knows, in a group other than `other`;
the layer map is the loader's; `explain` places every tensor and, where memory is still refused (`REFUSED`:
none left), names the tensors of the block it does not build. The others keep their placement checks here
with their memory modelled since (`MODELLED_SINCE`: `explain` prints their memory): the expert branch of
dense architectures' loaders (granite, mistral3, refact: no MoE checkpoint is published, so synthetic
layouts on published dense widths; Nemotron-3-Nano's config written as `nemotron_h`, which the converter
writes as nemotron_h_moe), Granite-SWASH (`granite_swa`: attention sinks, fused expert gate/up), Mellum 2
and Maple (classic blocks with per-head q/k norms and sliding windows), Hy4-preview (`hy_v4`: gated MLA,
a DSA indexer on its "full" blocks, hyper-connections), MiniMax-Text-01 (`minimax-01`: lightning
attention), GroveMoE's adjugate experts (`grovemoe`, ffn_*_chexps) and Qwen3.8-Flash-Next (`qwen4exp`:
low-rank hyper-connections, gated delta net, the block-pooled indexer, PLE n-gram embeddings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

# layout -> (architecture, the tensors no modelled architecture has, as the refusal names them; empty:
# every kind of tensor it has is modelled for another architecture, the graph's composition is missing)
REFUSED: dict[str, tuple[str, tuple[str, ...]]] = {}
# refused here first, their memory modelled since (memory/graph/archs/<arch>.py; tests/data/graph_oracle/):
# placed as before, `explain` prints their memory
MODELLED_SINCE: dict[str, str] = {
    # synthetic: the expert branch of dense architectures' loaders (no MoE checkpoint is published)
    "granite-synthetic-moe": "granite", "mistral3-synthetic-moe": "mistral3", "refact-synthetic-moe": "refact",
    "nemotron-h-synthetic-moe": "nemotron_h",
    # published MoEs
    "granite-swash-3b-a600m": "granite_swa", "mellum2-12b-a2.5b": "mellum", "maple-preview": "maple",
    "hy4-preview": "hy_v4", "minimax-text-01": "minimax-01", "qwen3.8-flash-next": "qwen4exp",
}
ARCH = {**{k: a for k, (a, _) in REFUSED.items()}, **MODELLED_SINCE}
MODELLED = set(MODELLED_SINCE)
SYNTHETIC = ("granite-synthetic-moe", "mistral3-synthetic-moe", "refact-synthetic-moe")
# the global line of `-ngl 999 -ot exps=CPU` where the output is tied (the engine's copy of token_embd)
TIED = {"granite-synthetic-moe", "granite-swash-3b-a600m"}
OWN_GLOBALS = {"qwen3.8-flash-next": "token_embd.weight CPU, output_hc_norm.weight CUDA0, output_hc_down.weight CUDA0, "
                                     "output_hc_up.weight CUDA0, output.weight CUDA0, per_layer_token_embd.weight CPU"}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    from tests.engine.oracle import write_sparse

    return write_sparse(tmp_path_factory.mktemp("refused-layouts"),
                        {key: LAYOUTS[key] for key in (*ARCH, "grovemoe-inst")})


@pytest.mark.parametrize("key", sorted(ARCH))
def test_every_tensor_is_known_and_grouped(files: dict[str, tuple[Path, Inventory]], key: str) -> None:
    _, inv = files[key]
    assert inv.arch == ARCH[key]
    unknown = [t.name for t in inv.tensors if not t.known or t.group == "other"]
    assert not unknown, unknown[:8]


def test_grovemoe_adjugate_experts_are_experts(files: dict[str, tuple[Path, Inventory]]) -> None:
    """One adjugate expert per group of two experts, 128 wide, in every block: experts, so that
    `-ot exps=CPU` and --n-cpu-moe take them as llama.cpp does."""
    _, inv = files["grovemoe-inst"]
    chexps = [t for t in inv.tensors if "chexps" in t.name]
    assert len(chexps) == 3 * 48
    assert {t.group for t in chexps} == {"experts"}
    assert inv.by_name["blk.5.ffn_up_chexps.weight"].shape == (2048, 128, 64)
    assert inv.layers_of_kind("moe") == list(range(48))


def test_minimax_01_lightning_blocks_are_the_loaders(files: dict[str, tuple[Path, Inventory]]) -> None:
    """Softmax attention on every eighth block ((il + 1) % 8 == 0, the loader's default interval and
    the checkpoint's attn_type_list), lightning attention (recurrent) on the other 70."""
    _, inv = files["minimax-text-01"]
    assert set(inv.layers_of_kind("recurrent")) == {il for il in range(80) if (il + 1) % 8 != 0}
    assert "blk.7.attn_q.weight" in inv.by_name and "blk.7.attn_norm_2.weight" not in inv.by_name
    assert "blk.8.attn_norm_2.weight" in inv.by_name and "blk.8.attn_q.weight" not in inv.by_name


@pytest.mark.parametrize("key", sorted(ARCH))
def test_explain_places_and_refuses_memory(files: dict[str, tuple[Path, Inventory]], key: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = files[key]
    assert main(["explain", str(path), "--engine", "llama.cpp", "--", "-ngl", "999", "-ot", "exps=CPU",
                 "-fit", "off"]) == 0
    out = capsys.readouterr().out
    output = "token_embd.weight (output copy)" if key in TIED else "output.weight"
    # qwen4exp: no output_norm (the output's hyper-connection mixer carries it); its n-gram table on the host
    glob = OWN_GLOBALS.get(key, f"token_embd.weight CPU, output_norm.weight CUDA0, {output} CUDA0")
    assert f"global: {glob}" in out
    if key in MODELLED:
        assert "memory is not modelled" not in out and "memory (MiB) at" in out, out[-2000:]
        return
    arch, missing = REFUSED[key]
    note = next(line for line in out.splitlines() if "memory is not modelled" in line)
    assert f"for the '{arch}' architecture" in note
    if missing:
        assert f"(tensors no modelled architecture has: {', '.join(missing)})" in note
    else:
        assert "no composition of its graph yet (every kind of tensor it has is modelled for another" in note
    assert "KV cache and compute are not computed" in note


@pytest.mark.parametrize("key", SYNTHETIC)
def test_synthetic_expert_branch_is_the_loaders(files: dict[str, tuple[Path, Inventory]], key: str) -> None:
    """The loader's `n_expert > 0` branch: a router and three expert tensors of the dense FFN width
    (feed_forward_length, n_ff) on every block, and no dense FFN."""
    _, inv = files[key]
    lay = LAYOUTS[key]
    assert inv.layers_of_kind("moe") == list(range(lay.blocks))
    for il in (0, lay.blocks - 1):
        p = f"blk.{il}."
        assert inv.by_name[p + "ffn_gate_inp.weight"].shape == (lay.hidden, lay.experts)
        assert inv.by_name[p + "ffn_up_exps.weight"].shape == (lay.hidden, lay.ff_dense, lay.experts)
        assert inv.by_name[p + "ffn_down_exps.weight"].shape == (lay.ff_dense, lay.hidden, lay.experts)
        assert p + "ffn_up.weight" not in inv.by_name
        assert {inv.by_name[p + f"ffn_{x}_exps.weight"].group for x in ("gate", "up", "down")} == {"experts"}


@pytest.mark.parametrize(("key", "blocks", "experts", "width"),
                         [("mellum2-12b-a2.5b", 28, 64, 896), ("maple-preview", 24, 256, 512)])
def test_mellum_and_maple_blocks_are_the_loaders(files: dict[str, tuple[Path, Inventory]], key: str, blocks: int,
                                                 experts: int, width: int) -> None:
    """Every block MoE (the loaders refuse n_expert == 0) with experts of expert_feed_forward_length,
    per-head q/k norms, and the checkpoints' sliding window on three blocks of four."""
    _, inv = files[key]
    assert inv.layers_of_kind("moe") == list(range(blocks))
    assert inv.by_name["blk.3.ffn_gate_exps.weight"].shape == (2048 if key == "maple-preview" else 2304, width,
                                                               experts)
    assert inv.by_name["blk.0.attn_q_norm.weight"].shape == (128,)
    assert inv.metadata.sliding_window_pattern == tuple(il % 4 != 3 for il in range(blocks))


def test_granite_swash_experts_are_fused_and_sinks_per_head(files: dict[str, tuple[Path, Inventory]]) -> None:
    """The converter keeps the experts' and the shared expert's gate and up fused; the loader's
    gate_up_exps is twice the expert width and an expert tensor (-ot exps=CPU takes it), the
    shared expert's fused up is not; one attention sink per head on every block."""
    _, inv = files["granite-swash-3b-a600m"]
    gu = inv.by_name["blk.4.ffn_gate_up_exps.weight"]
    assert gu.shape == (1536, 1024, 48) and gu.group == "experts"
    assert "blk.4.ffn_gate_exps.weight" not in inv.by_name
    assert inv.by_name["blk.4.ffn_up_shexp.weight"].shape == (1536, 2560)
    assert inv.by_name["blk.4.ffn_up_shexp.weight"].group != "experts"
    assert inv.by_name["blk.31.attn_sinks.weight"].shape == (24,)
    assert inv.metadata.sliding_window_pattern == tuple(il % 4 != 0 for il in range(32))


def test_nemotron_h_synthetic_is_nanos_tensors_under_nemotron_h(files: dict[str, tuple[Path, Inventory]],
                                                                 tmp_path: Path) -> None:
    """The `nemotron_h` loader's expert branch is nemotron_h_moe's (one loader): the same tensors,
    names and shapes, as the published Nemotron-3-Nano; only the architecture name differs, and
    with it memory is refused where nemotron_h_moe's is modelled."""
    _, inv = files["nemotron-h-synthetic-moe"]
    nano = tmp_path / "nano.gguf"
    write_layout(LAYOUTS["nemotron-3-nano-30b-a3b"], nano)
    ref = load_inventory(nano)
    assert ref.arch == "nemotron_h_moe" and inv.arch == "nemotron_h"
    assert [(t.name, t.shape, t.group) for t in inv.tensors] == [(t.name, t.shape, t.group) for t in ref.tensors]


def test_hy4_indexer_blocks_and_hyper_connections_are_the_loaders(files: dict[str, tuple[Path, Inventory]]) -> None:
    """The indexer's tensors only on the blocks the indexer types mark full (0 and 1 + 4k), the
    hyper-connection mixers on every block and at the output, one leading dense block."""
    _, inv = files["hy4-preview"]
    full = {il for il in range(78) if il == 0 or (il - 1) % 4 == 0}
    assert {t.layer for t in inv.tensors if t.name.endswith("indexer.attn_k.weight")} == full
    assert inv.by_name["blk.9.hc_ffn_fn.weight"].shape == (4 * 6144, 8)
    assert inv.by_name["output_hc_fn.weight"].layer is None
    assert inv.layers_of_kind("dense") == [0] and inv.layers_of_kind("moe") == list(range(1, 78))
    assert inv.by_name["blk.1.ffn_up_shexp.weight"].shape == (6144, 2048)


def test_qwen4exp_blocks_and_ple_are_the_loaders(files: dict[str, tuple[Path, Inventory]]) -> None:
    """Full attention (gated queries, the indexer) on every fourth block, the gated delta net on the
    others, the PLE module on block 1 only (ple_layer_ids [2], 1-based) and its table (16 heads of
    160-wide rows, 20M rows each) a global embedding; no output_norm (the output mixer's)."""
    _, inv = files["qwen3.8-flash-next"]
    full = {il for il in range(48) if (il + 1) % 4 == 0}
    assert {t.layer for t in inv.tensors if t.name.endswith("indexer.q_proj.weight")} == full
    assert set(inv.layers_of_kind("recurrent")) == set(range(48)) - full
    assert inv.by_name["blk.0.attn_qkv.weight"].shape == (2560, 2 * 16 * 128 + 48 * 128)
    assert inv.by_name["blk.3.attn_q.weight"].shape == (2560, 2 * 24 * 256)
    assert {t.layer for t in inv.tensors if ".ple_" in t.name} == {1}
    ple = inv.by_name["per_layer_token_embd.weight"]
    assert ple.shape == (160, 16 * 20_000_000) and ple.layer is None and ple.group == "embd"
    assert inv.by_name["blk.7.hc_ffn_down.weight"].shape == (4 * 2560, 320)
    assert "output_norm.weight" not in inv.by_name and inv.by_name["output_hc_up.weight"].group == "output"


def test_qwen4exp_ple_hash_constants_are_uint64_arrays(files: dict[str, tuple[Path, Inventory]]) -> None:
    """The loader reads the PLE hash constants only as uint64 arrays (llama_model_loader::get_arr
    refuses any other item type): the writer writes `u64[]` keys with uint64 items, where gguf-py
    on its own infers int32 from Python ints."""
    import gguf

    path, _ = files["qwen3.8-flash-next"]
    fields = gguf.GGUFReader(path).fields
    for key in ("layer_multipliers", "head_offsets", "head_vocab_sizes"):
        f = fields[f"qwen4exp.ple.{key}"]
        assert f.types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT64], key
    offsets = fields["qwen4exp.ple.head_offsets"]
    assert [int(offsets.parts[i][0]) for i in offsets.data] == [h * 20_000_000 for h in range(16)]
    assert fields["qwen4exp.ple.layers"].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]


@pytest.mark.parametrize(("key", "value", "why"), [
    ("attention.indexer.top_k", None, "without the DSA indexer"),
    ("attention.indexer.types", None, "attention.indexer.types is missing: the engine refuses the file"),
    ("attention.indexer.types", 1, "not one value per layer with the first layer full"),
    ("attention.indexer.types", (0,) + (1,) * 77, "not one value per layer with the first layer full"),
])
def test_hy4_files_its_composition_does_not_build_are_refused(files: dict[str, tuple[Path, Inventory]], key: str,
                                                               value: int | tuple[int, ...] | None, why: str) -> None:
    """Hy4 without the indexer (the all-full-attention checkpoints: a plain MLA cache and another graph),
    without its indexer types (the loader refuses layer 0 without an indexer), or with types other than one
    per layer with layer 0 full: memory not modelled."""
    import dataclasses

    from tests import graph_oracle

    _, inv = files["hy4-preview"]
    assert graph_oracle.estimate_line(inv, "-c 4096 -ngl 999").complete
    md = inv.metadata
    hps = tuple((k, v) for k, v in md.hparams if k != key) + (((key, value),) if value is not None else ())
    keys = tuple(k for k in (md.arch_keys or ()) if k != key) + ((key,) if value is not None else ())
    est = graph_oracle.estimate_line(dataclasses.replace(inv, metadata=dataclasses.replace(md, hparams=hps,
                                                                                            arch_keys=keys)),
                                     "-c 4096 -ngl 999")
    assert not est.complete and any(why in n for n in est.notes), est.notes


@pytest.mark.parametrize("ratios", [tuple(4 if (il + 1) % 4 == 0 and il != 3 else 0 for il in range(48)), 0])
def test_qwen4exp_dense_full_blocks_are_refused(files: dict[str, tuple[Path, Inventory]],
                                                ratios: int | tuple[int, ...]) -> None:
    """A full-attention block with compress ratio 0 attends densely, a branch of the engine's graph no
    recorded dump has: memory not modelled (block 3's ratio 0 among the full blocks' 4s, or one 0 for all)."""
    import dataclasses

    from tests import graph_oracle

    _, inv = files["qwen3.8-flash-next"]
    assert graph_oracle.estimate_line(inv, "-c 4096 -ngl 999").complete
    md = inv.metadata
    key = "attention.compress_ratios"
    hps = (*((k, v) for k, v in md.hparams if k != key), (key, ratios))
    est = graph_oracle.estimate_line(dataclasses.replace(inv, metadata=dataclasses.replace(md, hparams=hps)),
                                     "-c 4096 -ngl 999")
    dense = [3] if isinstance(ratios, tuple) else list(range(3, 48, 4))
    assert not est.complete and any(f"compress ratio 0: blocks {dense}" in n for n in est.notes), est.notes


def test_qwen4exp_ple_row_is_the_engines(files: dict[str, tuple[Path, Inventory]]) -> None:
    """The PLE block's conv history (memory/recurrent.py ple_bytes, in the KV figure beside the delta net's
    state) is the engine's own recurrent row: cache_ple_r_l1 of its recorded real-config graph, per sequence;
    the other blocks have none."""
    import gzip
    import json
    import math

    from moeconf.memory.recurrent import ple_bytes

    _, inv = files["qwen3.8-flash-next"]
    dump = Path(__file__).parent / "data" / "graphs" / "qwen4exp-real-expscpu32k.json.gz"
    leafs = {x["name"]: x for x in json.loads(gzip.decompress(dump.read_bytes()))["leafs"]}
    row = leafs["cache_ple_r_l1"]
    assert row["type"] == "f32" and row["ne"][1] == 1
    assert ple_bytes(inv, 1, 1) == 4 * math.prod(row["ne"]) == 4 * 9 * 4 * 2560
    assert ple_bytes(inv, 1, 3) == 3 * ple_bytes(inv, 1, 1)
    assert ple_bytes(inv, 0, 1) == ple_bytes(inv, 3, 1) == 0


@pytest.mark.parametrize("key", ["hyper_connection.count", "attention.indexer.top_k", "ple.conv_kernel"])
def test_qwen4exp_files_without_a_required_size_are_refused(files: dict[str, tuple[Path, Inventory]],
                                                             key: str) -> None:
    """A size the engine's loader requires (it refuses the file without it) and the graph reads: memory not
    modelled, naming the key (the indexer's top-k by memory/indexer.py, the others by the composition)."""
    import dataclasses

    from tests import graph_oracle

    _, inv = files["qwen3.8-flash-next"]
    md = inv.metadata
    hps = tuple((k, v) for k, v in md.hparams if k != key)
    keys = tuple(k for k in (md.arch_keys or ()) if k != key)
    est = graph_oracle.estimate_line(dataclasses.replace(inv, metadata=dataclasses.replace(md, hparams=hps,
                                                                                            arch_keys=keys)),
                                     "-c 4096 -ngl 999")
    assert not est.complete and any(f"qwen4exp.{key} " in n for n in est.notes), est.notes

