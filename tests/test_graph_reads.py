"""A file lacking a weight llama.cpp's graph reads (one tensor kind dropped from every block, or one global
tensor, of each architecture's tiny graph model, kind by kind): the estimate refuses it, naming the tensor
(`MissingTensor`, memory/graph/blocks.py), where 373 of these 1,326 files stopped with an internal error; the
pinned engine does not load such files (tests/engine/test_required_tensors.py:
test_the_engine_stops_without_a_weight_the_graph_reads). Files lacking what the graph does not read are sized
or refused as before."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moeconf.fixtures.graphmodels import ARCHS, write_graph_model
from moeconf.model.load import load_inventory
from tests.graph_oracle import estimate_line

READS = "graph reads in the form the file has: the pinned llama.cpp does not load it"
# the kinds whose absence makes the graph read another form, which it then names (the file lacks both): the plain
# Q for the low-rank one, the KDA output gate's own projection for its low-rank pair, the experts' gate and up apart
# for fused, Qwen3.5's fused beta-alpha projection for its separate beta
INSTEAD = {"attn_q_a": "attn_q", "ssm_g": "ssm_g_a", "ffn_gate_up_exps": "ffn_up_exps", "ssm_beta": "ssm_ba"}


def kinds(arch: str, folder: Path) -> dict[str, list[str]]:
    """The tiny model's tensors by kind (`blk.N.` standing for every block's)."""
    whole = load_inventory(write_graph_model(arch, "a", folder / f"{arch}.gguf"))
    out: dict[str, list[str]] = {}
    for t in whole.tensors:
        out.setdefault(re.sub(r"^blk\.\d+\.", "blk.N.", t.name), []).append(t.name)
    return out


def graph_refusals(arch: str, folder: Path) -> dict[str, str]:
    """Kind -> the refusal, for the kinds whose absence the graph refuses (`MissingTensor`)."""
    out = {}
    every = kinds(arch, folder)
    have = {n for names in every.values() for n in names}
    for kind, names in every.items():
        est = estimate_line(load_inventory(write_graph_model(arch, "a", folder / "less.gguf", drop=names)),
                            "-c 4096 -ngl 999")  # never an exception
        said = [n for n in est.notes if READS in n]
        if said:  # the tensor dropped, or the one the graph reads in its place (INSTEAD)
            lacks = re.search(r"it lacks (\S+),", said[0])
            assert not est.complete and lacks, (kind, said)
            base = kind.removeprefix("blk.N.").removesuffix(".weight")
            other = {n.replace(f".{base}.", f".{INSTEAD[base]}.") for n in names} if base in INSTEAD else set()
            assert lacks.group(1) in set(names) | other - have, (kind, said)
            out[kind] = said[0]
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_a_file_without_a_weight_the_graph_reads_is_refused_not_an_error(arch: str, tmp_path: Path) -> None:
    graph_refusals(arch, tmp_path)


def test_the_refusal_names_the_tensor(tmp_path: Path) -> None:
    # qwen3moe's attention projections come from a helper (create_tensor_qkv: attn_qkv, or attn_q, attn_k and
    # attn_v), which the required-tensor table does not read: the graph is what finds them missing
    said = graph_refusals("qwen3moe", tmp_path)
    assert said["blk.N.attn_q.weight"] == (
        "compute not modelled for this qwen3moe file: it lacks blk.0.attn_q.weight, which llama.cpp's qwen3moe "
        "graph reads in the form the file has: the pinned llama.cpp does not load it (its loader stops: \"tensor "
        "... not found\", or building the graph fails); check the file's conversion")
