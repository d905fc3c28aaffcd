"""An engine invocation as the engine reads it: argv (and env) -> the placement-relevant settings,
each with where it was written, and the ordered list of override items the engine will test.

Order of sources (engine facts section 2): mainline reads env first (`LLAMA_ARG_OVERRIDE_TENSOR`,
then `LLAMA_ARG_CPU_MOE`, then `LLAMA_ARG_N_CPU_MOE`), then the command line left to right;
ik_llama.cpp puts every user `-ot` first, then its `--n-cpu-moe` rules, and reads none of those
from the environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from moeconf.engines import Engine
from moeconf.model.inventory import Inventory


@dataclass(frozen=True)
class Arg:
    """A word of a command line and where its text starts (1-based line and column; 0 when unknown)."""

    text: str
    path: str = ""
    line: int = 0
    column: int = 0

    def at(self, offset: int) -> tuple[int, int]:
        """Line and column of the character `offset` into this word."""
        return self.line, (self.column + offset) if self.column else 0


# options that take a value (both engines' spellings)
_VALUED = {
    "-m", "--model", "-ngl", "--gpu-layers", "--n-gpu-layers", "-ot", "--override-tensor", "-ncmoe",
    "--n-cpu-moe", "--rpc", "-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu", "-c",
    "--ctx-size", "-b", "--batch-size", "-ub", "--ubatch-size", "-t", "--threads", "-tb", "--threads-batch",
    "-ctk", "--cache-type-k", "-ctv", "--cache-type-v", "--host", "--port", "-lm", "--load-mode", "-fitt",
    "--fit-target", "-fitc", "--fit-ctx", "--fit-margin", "-a", "--alias", "-np", "--parallel", "-n",
    "--n-predict", "-p", "--prompt", "--chat-template", "--chat-template-file", "-md", "--model-draft",
    "--spec-type", "--temp", "--top-k", "--top-p", "--min-p", "--seed", "-s", "--mmproj", "-dev", "--device",
    "--numa", "-cb", "--api-key", "--slot-save-path", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file",
    "--lora", "--control-vector", "--grammar", "--grammar-file", "-j", "--json-schema", "--reasoning-format",
    "--reasoning-budget", "-ngld", "--gpu-layers-draft", "--draft-max", "--draft-min", "-otd",
    "--override-tensor-draft", "-amb", "-ser", "--cache-ram", "-gfm", "--gpu-fit-margin", "--max-gpu",
}
_FA_VALUES = {"on", "off", "auto", "enabled", "disabled", "true", "false", "1", "0", "-1"}


@dataclass(frozen=True)
class OtValue:
    """One `-ot` value (or `LLAMA_ARG_OVERRIDE_TENSOR`): where it came from, and its order."""

    value: Arg
    flag: Arg | None  # None for the env form
    order: int


@dataclass(frozen=True)
class RawItem:
    """One comma-separated item of an -ot value, before the engine validates it."""

    text: str
    source: OtValue
    offset: int  # into source.value.text

    @property
    def pattern(self) -> str | None:
        return self.text.split("=", 1)[0] if "=" in self.text else None

    @property
    def device(self) -> str | None:
        return self.text.split("=", 1)[1] if "=" in self.text else None

    def position(self, within: int = 0) -> tuple[int, int]:
        return self.source.value.at(self.offset + within)


@dataclass
class Invocation:
    """The placement-relevant part of an engine invocation."""

    engine: Engine
    args: list[Arg]
    env: dict[str, Arg] = field(default_factory=dict)
    binary: Arg | None = None
    model: Arg | None = None
    ot: list[OtValue] = field(default_factory=list)
    cpu_moe: list[tuple[Arg, int, str]] = field(default_factory=list)  # (flag, order, "cli"|"env")
    n_cpu_moe: list[tuple[Arg, int, int, str]] = field(default_factory=list)  # (flag, N, order, source)
    ngl: tuple[Arg, int] | None = None  # value; -1 auto, -2 all
    fit: tuple[Arg, bool] | None = None
    rpc: list[tuple[Arg, Arg, int]] = field(default_factory=list)  # (flag, value, order)
    split_mode: Arg | None = None
    tensor_split: Arg | None = None
    merge_qkv: Arg | None = None
    merge_up_gate: Arg | None = None
    ctx_size: Arg | None = None
    problems: list[tuple[Arg, str]] = field(default_factory=list)  # values the engine rejects

    def items(self) -> list[RawItem]:
        """Every user item, in the order the engine tests them (env first on mainline)."""
        out: list[RawItem] = []
        words = self.engine.ot_items_read_as_words
        for ov in sorted(self.ot, key=lambda o: o.order):
            pos = 0
            parts = ov.value.text.split(",")
            if words and len(parts) > 1 and parts[-1] == "":
                parts.pop()  # getline adds no item after a trailing comma
            for part in parts:
                if words:
                    m = re.search(r"\S+", part)
                    out.append(RawItem(m.group(0), ov, pos + m.start()) if m else RawItem("", ov, pos))
                else:
                    out.append(RawItem(part, ov, pos))
                pos += len(part) + 1
        return out

    def rpc_devices(self) -> list[str]:
        fmt = "RPC0[{}]" if self.engine.rpc_indexed else "RPC[{}]"
        return [fmt.format(s) for _, v, _ in self.rpc for s in v.text.split(",") if s]

    def n_gpu_layers(self) -> int:
        return self.ngl[1] if self.ngl else self.engine.default_ngl


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_invocation(args: Sequence[Arg], engine: Engine, env: Mapping[str, Arg] | None = None) -> Invocation:
    """Read argv (binary first, or just options) and env as `engine` reads them."""
    inv = Invocation(engine=engine, args=list(args), env=dict(env or {}))
    order = 0
    # env first (mainline only: ik reads none of these)
    if engine.env_override_tensor and "LLAMA_ARG_OVERRIDE_TENSOR" in inv.env:
        inv.ot.append(OtValue(inv.env["LLAMA_ARG_OVERRIDE_TENSOR"], None, order))
        order += 1
    if engine.env_cpu_moe and "LLAMA_ARG_CPU_MOE" in inv.env:
        v = inv.env["LLAMA_ARG_CPU_MOE"]
        if v.text in ("on", "enabled", "true", "1"):
            inv.cpu_moe.append((v, order, "env"))
            order += 1
    if engine.env_cpu_moe and "LLAMA_ARG_N_CPU_MOE" in inv.env:
        v = inv.env["LLAMA_ARG_N_CPU_MOE"]
        n = _int(v.text)
        if n is not None:
            inv.n_cpu_moe.append((v, n, order, "env"))
            order += 1
    if "LLAMA_ARG_N_GPU_LAYERS" in inv.env:
        inv.ngl = _parse_ngl(inv, inv.env["LLAMA_ARG_N_GPU_LAYERS"])
    if engine.has_fit and engine.fit_flag == "-fit" and "LLAMA_ARG_FIT" in inv.env:
        v = inv.env["LLAMA_ARG_FIT"]
        inv.fit = (v, v.text in ("on", "enabled", "true", "1"))
    if "LLAMA_ARG_MODEL" in inv.env:
        inv.model = inv.env["LLAMA_ARG_MODEL"]

    words = list(args)
    i = 0
    if words and not words[0].text.startswith("-"):
        inv.binary = words[0]
        i = 1
    while i < len(words):
        w = words[i]
        name, value = w.text, None
        if name.startswith("--") and "=" in name:
            name, _, rest = name.partition("=")
            value = Arg(rest, w.path, w.line, w.column + len(name) + 1 if w.column else 0)
        flag = Arg(name, w.path, w.line, w.column)
        takes = name in _VALUED or (name in ("-fa", "--flash-attn") and engine.fa_takes_value) or (
            name in ("-fit", "--fit") and engine.fit_flag == "-fit")
        if takes and value is None:
            if name in ("-fa", "--flash-attn") and (i + 1 >= len(words) or words[i + 1].text not in _FA_VALUES):
                takes = False
            elif i + 1 < len(words):
                value = words[i + 1]
                i += 1
            else:
                inv.problems.append((flag, f"{name} needs a value"))
                i += 1
                continue
        i += 1
        if name in ("-m", "--model"):
            inv.model = value
        elif name in ("-ot", "--override-tensor"):
            assert value is not None
            inv.ot.append(OtValue(value, flag, order))
            order += 1
        elif name in ("-cmoe", "--cpu-moe"):
            inv.cpu_moe.append((flag, order, "cli"))
            order += 1
        elif name in ("-ncmoe", "--n-cpu-moe"):
            assert value is not None
            n = _int(value.text)
            if n is None or n < 0:
                inv.problems.append((value, f"--n-cpu-moe needs a number >= 0, not {value.text!r}"))
            else:
                inv.n_cpu_moe.append((flag, n, order, "cli"))
                order += 1
        elif name in ("-ngl", "--gpu-layers", "--n-gpu-layers"):
            assert value is not None
            inv.ngl = _parse_ngl(inv, value)
        elif name in ("-fit", "--fit"):
            if engine.fit_flag == "-fit":
                assert value is not None
                inv.fit = (value, value.text in ("on", "enabled", "true", "1"))
            else:
                inv.fit = (flag, True)
        elif name in ("--rpc",):
            assert value is not None
            inv.rpc.append((flag, value, order))
            order += 1
        elif name in ("-sm", "--split-mode"):
            inv.split_mode = value
        elif name in ("-ts", "--tensor-split"):
            inv.tensor_split = value
        elif name in ("-mqkv", "--merge-qkv"):
            inv.merge_qkv = flag
        elif name in ("-muge", "--merge-up-gate-experts"):
            inv.merge_up_gate = flag
        elif name in ("-c", "--ctx-size"):
            inv.ctx_size = value
    return inv


def _parse_ngl(inv: Invocation, v: Arg) -> tuple[Arg, int] | None:
    t = v.text.strip()
    if t in ("auto", "all"):
        if not inv.engine.ngl_words:
            inv.problems.append((v, f"{inv.engine.label} takes a number for -ngl, not {t!r}"))
            return None
        return (v, -1 if t == "auto" else -2)
    n = _int(t)
    if n is None:
        inv.problems.append((v, f"-ngl needs a number, not {t!r}"))
        return None
    return (v, n)


# --- the engines' own MoE rules ----------------------------------------------------------------

def cpu_moe_pattern(engine: Engine, block: int | None = None) -> str:
    """The regex `--cpu-moe` (block None) or one block of `--n-cpu-moe` adds."""
    if engine.name == "ik_llama.cpp":
        assert block is not None
        return rf"blk\.{block}\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)"
    kinds = "up|down|gate|gate_up" if engine.ncmoe_pattern_has_gate_up else "up|down|gate"
    ch = "_(ch|)exps" if (engine.build or 0) >= 6586 else "_exps"
    body = rf"\.ffn_({kinds}){ch}"
    return body if block is None else rf"blk\.{block}{body}"


def ncmoe_blocks(engine: Engine, inv: Inventory, n: int) -> list[int]:
    """Which blocks `--n-cpu-moe n` moves: the first n block indices on mainline (dense blocks
    included); the last n layers that have routed experts on ik_llama.cpp (skipping nextn
    blocks in newer builds)."""
    if engine.ncmoe_takes == "first":
        return list(range(min(n, inv.block_count)))
    nextn = set(inv.layers_of_kind("nextn"))
    with_experts = sorted({t.layer for t in inv.tensors if t.layer is not None and t.base == "ffn_down_exps"})
    if engine.ncmoe_skips_nextn:
        with_experts = [il for il in with_experts if il not in nextn]
    return with_experts[-n:] if n else []


def engine_items(inv_: Invocation, model: Inventory) -> list[tuple[str, str, str, int | None]]:
    """All items the engine tests, in order: (pattern, device, origin, raw item index or None).
    Raw items that the engine would reject are left out (the engine would not start)."""
    eng = inv_.engine
    raw = inv_.items()
    user = [(it.pattern or "", it.device or "", f"-ot item {k + 1}", k, it.source.order)
            for k, it in enumerate(raw) if it.pattern is not None]
    moe: list[tuple[str, str, str, int | None, int]] = []
    for _flag, order, src in inv_.cpu_moe:
        if eng.name == "ik_llama.cpp":
            for il in ncmoe_blocks(eng, model, 999):
                moe.append((cpu_moe_pattern(eng, il), "CPU", f"--cpu-moe ({src})", None, order))
        else:
            moe.append((cpu_moe_pattern(eng), "CPU", f"--cpu-moe ({src})", None, order))
    for _flag, n, order, src in inv_.n_cpu_moe:
        for il in ncmoe_blocks(eng, model, n):
            moe.append((cpu_moe_pattern(eng, il), "CPU", f"--n-cpu-moe {n} ({src})", None, order))
    # ik: user rules first, then its --n-cpu-moe rules; mainline: sources in order
    merged = user + moe if eng.name == "ik_llama.cpp" else sorted(user + moe, key=lambda x: x[4])
    return [(p, d, o, k) for p, d, o, k, _ in merged]

