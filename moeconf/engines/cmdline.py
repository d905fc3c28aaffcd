"""An engine invocation as the engine reads it: argv (and env) -> the placement-relevant settings,
each with where it was written, and the ordered list of override items the engine will test.

Order of sources (engine facts section 2): mainline reads env first (`LLAMA_ARG_OVERRIDE_TENSOR`,
then `LLAMA_ARG_CPU_MOE`, then `LLAMA_ARG_N_CPU_MOE`), then the command line left to right;
ik_llama.cpp puts every user `-ot` first, then its `--n-cpu-moe` rules, and reads none of those
from the environment.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from moeconf.engines import HOST, Engine
from moeconf.engines.argvread import (
    COMMON_ARG_BINARIES,
    Arg,
    ArgvReading,
    ConfigArg,
    closest_flag,
    config_where,
    known_flags,
    read_argv,
)
from moeconf.engines.flags import c_floats, c_int, value_problem
from moeconf.engines.llamaconfig import FALSE_WORDS, TRUE_WORDS, flash_attn_refusal, flash_attn_word
from moeconf.engines.options import env_var, out_of_range, row, spellings
from moeconf.model.inventory import Inventory

if TYPE_CHECKING:
    from moeconf.engines.benchline import BenchLine, BenchTest
    from moeconf.engines.llamaconfig import Applied, LlamaConfig


_FIT_VALUES = frozenset({*TRUE_WORDS, *FALSE_WORDS})  # -fit's handler: no auto, and it throws on anything else


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
    # -hf/-hfr/--hf-repo and -hff/--hf-file (or LLAMA_ARG_HF_REPO / _FILE), --offline: a model from
    # Hugging Face (moeconf.hub resolves it as the engine does)
    hf_repo: Arg | None = None
    hf_file: Arg | None = None
    offline: bool = False
    ot: list[OtValue] = field(default_factory=list)
    cpu_moe: list[tuple[Arg, int, str]] = field(default_factory=list)  # (flag, order, "cli"|"env")
    n_cpu_moe: list[tuple[Arg, int, int, str]] = field(default_factory=list)  # (flag, N, order, source)
    # mainline -ncffn/--n-cpu-ffn N (or LLAMA_ARG_N_CPU_FFN): the dense FFN of blocks 0..N-1 on the CPU
    n_cpu_ffn: list[tuple[Arg, int, int, str]] = field(default_factory=list)  # (flag, N, order, source)
    ngl: tuple[Arg, int] | None = None  # value; -1 auto, -2 all
    fit: tuple[Arg, bool] | None = None
    rpc: list[tuple[Arg, Arg, int]] = field(default_factory=list)  # (flag, value, order)
    split_mode: Arg | None = None
    tensor_split: Arg | None = None
    main_gpu: Arg | None = None
    merge_qkv: Arg | None = None
    merge_up_gate: Arg | None = None
    ctx_size: Arg | None = None
    device_list: Arg | None = None  # -dev/--device: the devices the engine may use, in order
    problems: list[tuple[Arg, str]] = field(default_factory=list)  # values the engine rejects
    unknown_flags: list[tuple[Arg, str | None]] = field(default_factory=list)  # (flag, closest known flag)
    # llama.cpp's config files (engines/llamaconfig.py): what they set for this program, applied
    # before the environment; None: none read (or not this machine's: `config_known` False)
    config: Applied | None = None
    config_known: bool = True
    config_source: LlamaConfig | None = None
    read_as: ArgvReading | None = None  # the command line as read once (read_argv; `reading`)
    # a llama-bench line (engines/benchline.py): the line as llama-bench reads it, and the test this
    # invocation is (its words are the test's, written as the common parser's line)
    bench: BenchLine | None = None
    bench_test: BenchTest | None = None

    @property
    def reading(self) -> ArgvReading:
        """The command line as the engine reads it (engines/argvread.py read_argv), read once."""
        if self.read_as is None:
            self.read_as = read_argv(self.args, self.engine)
        return self.read_as

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
        used = self.rpc if self.engine.rpc_repeats_add else self.rpc[-1:]
        return [fmt.format(s) for _, v, _ in used for s in v.text.split(",") if s]

    def n_gpu_layers(self) -> int:
        return self.ngl[1] if self.ngl else self.engine.default_ngl

    def tensor_split_values(self) -> list[float] | None:
        """`-ts` as numbers (`,` or `/` between them, each as std::stof reads it); None when not
        given or not numbers."""
        if self.tensor_split is None:
            return None
        return c_floats(self.tensor_split.text)


def _int(text: str) -> int | None:
    """A number as the engines' std::stoi reads it (`4096k` is 4096); None where it stops."""
    return c_int(text)


def parse_invocation(args: Sequence[Arg], engine: Engine, env: Mapping[str, Arg] | None = None,
                     config: LlamaConfig | None = None) -> Invocation:
    """Read argv (binary first, or just options) and env as `engine` reads them, after what
    llama.cpp's config files `config` set for the program (engines/llamaconfig.py: mainline
    b10398+ reads them before its environment)."""
    reading = read_argv(args, engine)
    inv = Invocation(engine=engine, args=list(args), env=dict(env or {}), read_as=reading)
    inv.binary = reading.binary
    binary = inv.binary.text.rsplit("/", 1)[-1].removesuffix(".exe") if inv.binary else None
    order = 0
    table = known_flags(engine)
    sp, ev = spellings, env_var  # the one option table (engines/options.py)

    def take(name: str, flag: Arg, value: Arg | None, src: str) -> None:
        """One option as the engine's handler takes it (the command line's, or the config's)."""
        nonlocal order
        refused = value_problem(engine, name, value.text) if value is not None else None
        if refused is not None and value is not None:
            # the engine's std::stoi / std::stof throws: it stops before loading (engines/flags.py)
            inv.problems.append((value, refused))
            return
        if name in sp("-m"):
            inv.model = value
        elif name in sp("-hf"):
            inv.hf_repo = value
        elif name in sp("-hff"):
            inv.hf_file = value
        elif name in sp("--offline"):
            inv.offline = True
        elif name in sp("-ot"):
            assert value is not None
            inv.ot.append(OtValue(value, flag, order))
            order += 1
        elif name in sp("-cmoe"):
            inv.cpu_moe.append((flag, order, src))
            order += 1
        elif name in sp("-ncmoe"):
            assert value is not None
            n = _int(value.text)
            if n is None or out_of_range(row("-ncmoe"), n):
                inv.problems.append((value, f"--n-cpu-moe needs a number >= 0, not {value.text!r}"))
            else:
                inv.n_cpu_moe.append((flag, n, order, src))
                order += 1
        elif name in sp("-ncffn") and engine.name == "llama.cpp" and name in table:
            assert value is not None
            n = _int(value.text)
            if n is None or out_of_range(row("-ncffn"), n):
                inv.problems.append((value, f"--n-cpu-ffn needs a number >= 0, not {value.text!r}"))
            else:
                inv.n_cpu_ffn.append((flag, n, order, src))
                order += 1
        elif name in sp("-ngl"):
            assert value is not None
            inv.ngl = _parse_ngl(inv, value)
        elif name in sp("-fit"):
            if engine.fit_flag == "-fit":
                assert value is not None
                inv.fit = (value, value.text in TRUE_WORDS)
            else:
                inv.fit = (flag, True)
        elif name in sp("--rpc"):
            assert value is not None
            inv.rpc.append((flag, value, order))
            order += 1
        elif name in sp("-sm"):
            inv.split_mode = value
        elif name in sp("-ts"):
            inv.tensor_split = value
        elif name in sp("-mg"):
            inv.main_gpu = value
        elif name in sp("-mqkv"):
            inv.merge_qkv = flag
        elif name in sp("-muge"):
            inv.merge_up_gate = flag
        elif name in sp("-c"):
            inv.ctx_size = value
        elif name in sp("-dev"):
            inv.device_list = value

    # the config files first (mainline b10398+: common_params_apply_system_config)
    if config is not None:
        from moeconf.engines.llamaconfig import apply

        inv.config_known = config.known
        inv.config_source = config
        applied = apply(config, engine, binary)
        inv.config = applied
        for st in applied.settings:
            e = st.entry
            words_ = st.words()
            key = ConfigArg(words_[0], file=e.path, file_line=e.line, file_column=e.column)
            val = (ConfigArg(words_[1], file=e.path, file_line=e.line, file_column=e.value_column)
                   if len(words_) > 1 else None)
            take(words_[0], key, val, st.where)
    # env next (mainline only: ik reads none of these); a number the engine cannot read stops it
    # ("error while handling environment variable")
    if engine.env_override_tensor:
        from moeconf.engines.llamaconfig import option_for_env

        for var, v in inv.env.items():
            opt = option_for_env(var)
            why = value_problem(engine, opt.first, v.text, var) if opt is not None else None
            if why is not None:
                inv.problems.append((v, why))
    if engine.env_override_tensor and ev("-ot") in inv.env:
        inv.ot.append(OtValue(inv.env[ev("-ot")], None, order))
        order += 1
    if engine.env_cpu_moe and ev("-cmoe") in inv.env:
        v = inv.env[ev("-cmoe")]
        if v.text in TRUE_WORDS:
            inv.cpu_moe.append((v, order, "env"))
            order += 1
    if engine.env_cpu_moe and ev("-ncmoe") in inv.env:
        v = inv.env[ev("-ncmoe")]
        n = _int(v.text)
        if n is not None:
            inv.n_cpu_moe.append((v, n, order, "env"))
            order += 1
    # common/arg.cpp applies the variables in option order: -ot, -cmoe, -ncmoe, then -ncffn
    if engine.name == "llama.cpp" and engine.env_cpu_moe and ev("-ncffn") in inv.env:
        v = inv.env[ev("-ncffn")]
        n = _int(v.text)
        if n is not None and n >= 0:
            inv.n_cpu_ffn.append((v, n, order, "env"))
            order += 1
    if ev("-ngl") in inv.env:
        inv.ngl = _parse_ngl(inv, inv.env[ev("-ngl")])
    if engine.env_override_tensor and ev("-c") in inv.env:
        inv.ctx_size = inv.env[ev("-c")]
    if engine.has_fit and engine.fit_flag == "-fit" and ev("-fit") in inv.env:
        v = inv.env[ev("-fit")]
        inv.fit = (v, v.text in TRUE_WORDS)
        if v.text not in _FIT_VALUES:  # the env loop rethrows the handler's error: the engine does not start
            inv.problems.append((v, f"unknown value for {ev('-fit')}: {v.text!r} ({engine.label} takes on or off, "
                                    "as written, and stops otherwise: 'error while handling environment variable')"))
    if ev("-m") in inv.env:
        inv.model = inv.env[ev("-m")]
    inv.hf_repo = inv.env.get(ev("-hf"), inv.hf_repo)
    inv.hf_file = inv.env.get(ev("-hff"), inv.hf_file)
    offline = row("--offline")
    if (engine.name != "ik_llama.cpp" or offline.ik_env) and inv.env.get(offline.env) is not None:
        # a switch: set where the word is truthy, as written (ik_llama.cpp reads its own short list: not this one)
        inv.offline = inv.env[offline.env].text in TRUE_WORDS
    if engine.env_split:
        inv.split_mode = inv.env.get(ev("-sm"), inv.split_mode)
        inv.tensor_split = inv.env.get(ev("-ts"), inv.tensor_split)
        inv.main_gpu = inv.env.get(ev("-mg"), inv.main_gpu)
        if ev("--rpc") in inv.env:
            inv.rpc.append((Arg(ev("--rpc")), inv.env[ev("--rpc")], order))
            order += 1

    check_flags = binary is None or binary in COMMON_ARG_BINARIES
    for o in reading.options:
        if o.inline and check_flags:
            # Neither engine splits --flag=value (both stop at the unknown argument); what was
            # meant is still simulated, and the word reported.
            inv.unknown_flags.append((o.word, o.name if o.kind == "known" else closest_flag(engine, o.name)))
        elif o.kind == "unknown" and check_flags:
            inv.unknown_flags.append((o.flag, o.closest))
        if o.missing:
            inv.problems.append((o.flag, f"{o.name} needs a value"))
            continue
        value = o.value
        if o.name in sp("-fa") and value is not None and flash_attn_word(value.text, engine) is None:
            # both engines read the next word as the value, whatever it is, and stop on a bad one
            inv.problems.append((value, flash_attn_refusal(o.name, value.text, engine)))
        elif (o.name in sp("-fit") and engine.fit_flag == "-fit" and value is not None
              and value.text not in _FIT_VALUES):
            inv.problems.append((value, f"unknown value for {o.name}: {value.text!r} ({engine.label} takes on or "
                                        "off after it, as written, and stops otherwise)"))
        take(o.name, o.flag, value, "cli")
    return inv


def _parse_ngl(inv: Invocation, v: Arg) -> tuple[Arg, int] | None:
    t = v.text.strip()
    if t in ("auto", "all") and inv.engine.ngl_words:
        return (v, -1 if t == "auto" else -2)
    n = _int(t)
    return None if n is None else (v, n)  # (a value the engine stops on is among the problems already)


# --- the engines' own MoE rules ----------------------------------------------------------------

def cpu_ffn_pattern(block: int) -> str:
    """The regex mainline's `--n-cpu-ffn` adds for one block (common/common.h:
    llm_ffn_block_regex with LLM_FFN_DENSE_REGEX): the dense FFN matrices, not the experts."""
    return rf"blk\.{block}\.ffn_(up|down|gate)\."


def cpu_moe_pattern(engine: Engine, block: int | None = None, *, per_device: bool = False) -> str:
    """The regex `--cpu-moe` (block None, mainline) or one block of `--n-cpu-moe` adds. ik's
    per-device share (2+ devices, -sm layer) always names the weights only."""
    if engine.name == "ik_llama.cpp":
        assert block is not None
        suffix = r"\.weight" if per_device else engine.ncmoe_suffix
        return rf"blk\.{block}\.ffn_(up|down|gate|gate_up)_exps{suffix}"
    kinds = "up|down|gate|gate_up" if engine.ncmoe_pattern_has_gate_up else "up|down|gate"
    ch = "_(ch|)exps" if (engine.build or 0) >= 6586 else "_exps"
    body = rf"\.ffn_({kinds}){ch}"
    return body if block is None else rf"blk\.{block}{body}"


@dataclass(frozen=True)
class NcmoeTake:
    """What `--n-cpu-moe N` (ik: also `--cpu-moe`, which is N = 999) does on a device setup."""

    n: int
    path: str  # "first", "last", "per-device", or "none" (ik: -sm none with 2+ devices)
    blocks: tuple[int, ...]  # blocks whose experts move to the CPU, in the order of the rules
    patterns: tuple[str, ...]  # one regex per block, same order
    # ik's per-device path: per device (its layer count, its share of N); the layer split it
    # was computed from, and whether that split is moeconf's estimate (ik splits by free memory)
    shares: tuple[tuple[int, int], ...] = ()
    layer_devices: tuple[int, ...] = ()
    estimated_split: bool = False

    def device_of(self, block: int) -> int | None:
        return self.layer_devices[block] if self.layer_devices else None


def ik_layer_devices(n_layer: int, ngl: int, n_devices: int, weights: Sequence[float] | None = None) -> list[int]:
    """moeconf's estimate of ik_llama.cpp's default device per block with 2+ devices: ik fills
    the devices in order, each up to its share (of free memory, or -ts), with the offloaded
    blocks (and the output layer when -ngl exceeds the block count); blocks left on the CPU
    count as the last device's. This is ik's own greedy with equal block sizes: the real split
    also weighs each block's bytes, KV cache and compute buffers, so it is an estimate, used only
    when the split is neither logged nor predicted (moeconf/iksplit.py predicts it exactly from
    -ts). One entry per block, then one for the output layer."""
    ngl = n_layer + 1 if ngl < 0 else ngl
    i_gpu_start = max(n_layer - ngl, 0)
    out = [n_devices - 1] * (n_layer + 1)
    w = [float(x) for x in (weights or [])][:n_devices]
    w += [0.0] * (n_devices - len(w))
    if not any(w):
        w = [1.0] * n_devices
    total = sum(w)
    splits, acc = [], 0.0
    for x in w:
        acc += x
        splits.append(acc / total)
    n_last = n_layer + (1 if ngl > n_layer else 0)
    size = n_last - i_gpu_start
    last, loaded = i_gpu_start, 0.0
    for d in range(n_devices):
        split_size = splits[d] * size
        il = last
        while il < n_last:
            if loaded + 1 <= split_size:
                out[il] = d
                loaded += 1
                il += 1
                continue
            if loaded + 1 - split_size < split_size - loaded:
                out[il] = d
                loaded += 1
                il += 1
            break
        last = il
    return out


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def ik_ncmoe_share(counts: Sequence[int], n: int, n_layer: int) -> list[int]:
    """ik_llama.cpp's share of `--n-cpu-moe n` per device, as its loader computes it (in float):
    round(count * n / n_layer) each (half away from zero), then while the total is over n take
    one from the device furthest above its exact share (the first on ties), while under n give
    one to the device furthest below it (never more than its layer count)."""
    share = []
    for c in counts:
        x = _f32(_f32(_f32(c) / n_layer) * n)
        share.append(math.floor(x + 0.5))
    want = [_f32(_f32(_f32(c) * n) / n_layer) for c in counts]
    total = sum(share)
    while total > n:
        best, ib = -1e30, -1
        for i in range(len(counts)):
            if share[i] == 0:
                continue
            err = _f32(share[i] - 1 - want[i])
            if err > best:
                best, ib = err, i
        if ib < 0:
            break
        share[ib] -= 1
        total -= 1
    while total < n:
        best, ib = 1e30, -1
        for i in range(len(counts)):
            if share[i] >= counts[i]:
                continue
            err = _f32(share[i] + 1 - want[i])
            if err < best:
                best, ib = err, i
        if ib < 0:
            break
        share[ib] += 1
        total += 1
    return share


def ncmoe_take(engine: Engine, inv: Inventory, n: int, *, n_devices: int = 1, split_mode: str | None = None,
               ngl: int | None = None, tensor_split: Sequence[float] | None = None,
               layer_devices: Sequence[int] | None = None) -> NcmoeTake:
    """Which blocks `--n-cpu-moe n` moves, and with which patterns.

    Mainline: blocks 0..n-1, whatever the devices. ik_llama.cpp with one device (or -sm
    graph/attn, or n >= block count): 0.1.5 takes blocks 0..n-1 (weights only); since PR #2262
    the last n blocks that have `ffn_down_exps`, skipping nextn blocks (`weight|scale`). ik with
    2+ devices in -sm layer: n is shared over the devices by their layer counts
    (ik_ncmoe_share) and each device gives up its own last blocks, experts or not (weights
    only); `layer_devices` is ik's split when known (read from its log), else estimated."""
    n_layer = inv.block_count
    if engine.name != "ik_llama.cpp":
        blocks = tuple(range(min(n, n_layer)))
        return NcmoeTake(n, "first", blocks, tuple(cpu_moe_pattern(engine, il) for il in blocks))
    if n <= 0:
        return NcmoeTake(n, "first", (), ())
    sm = split_mode or "layer"
    if sm in ("graph", "attn") or n >= n_layer or n_devices < 2:
        if engine.ncmoe_takes == "first":
            blocks = tuple(range(min(n, n_layer)))
        else:
            skip = set(inv.layers_of_kind("nextn")) if engine.ncmoe_skips_nextn else set()
            with_experts = sorted({t.layer for t in inv.tensors
                                   if t.layer is not None and t.base == "ffn_down_exps" and t.layer not in skip})
            blocks = tuple(reversed(with_experts))[:n]
        return NcmoeTake(n, engine.ncmoe_takes, blocks, tuple(cpu_moe_pattern(engine, il) for il in blocks))
    if sm != "layer":
        return NcmoeTake(n, "none", (), ())
    estimated = layer_devices is None
    devs = list(layer_devices) if layer_devices is not None else ik_layer_devices(
        n_layer, engine.default_ngl if ngl is None else ngl, n_devices, tensor_split)
    counts = [sum(1 for d in devs[:n_layer] if d == i) for i in range(n_devices)]
    share = ik_ncmoe_share(counts, n, n_layer)
    left = list(share)
    picked = []
    for il in range(n_layer - 1, -1, -1):
        if left[devs[il]] > 0:
            picked.append(il)
            left[devs[il]] -= 1
    return NcmoeTake(n, "per-device", tuple(picked),
                     tuple(cpu_moe_pattern(engine, il, per_device=True) for il in picked),
                     tuple(zip(counts, share, strict=True)), tuple(devs), estimated)


def ncmoe_blocks(engine: Engine, inv: Inventory, n: int, n_devices: int = 1) -> list[int]:
    """The blocks `--n-cpu-moe n` moves (sorted); see ncmoe_take."""
    return sorted(ncmoe_take(engine, inv, n, n_devices=n_devices).blocks)


def ik_ncmoe_value(inv_: Invocation) -> tuple[int, int, str, str] | None:
    """ik_llama.cpp keeps one --n-cpu-moe value: the last of --cpu-moe (999) and --n-cpu-moe N
    on the command line. (N, order, source, flag)."""
    cands = [(999, order, src, "--cpu-moe") for _f, order, src in inv_.cpu_moe]
    cands += [(n, order, src, "--n-cpu-moe") for _f, n, order, src in inv_.n_cpu_moe]
    return max(cands, key=lambda c: c[1]) if cands else None


def _src(src: str) -> str:
    """cli, env, or `config PATH:LINE` for a setting of a llama.cpp config file."""
    return src if src in ("cli", "env") else f"config {src}"


def invocation_ncmoe(inv_: Invocation, model: Inventory, n_devices: int = 1,
                     layer_devices: Sequence[int] | None = None) -> list[tuple[NcmoeTake, str, int]]:
    """Every --n-cpu-moe / --cpu-moe the engine applies: (what it takes, origin, order)."""
    eng = inv_.engine
    out: list[tuple[NcmoeTake, str, int]] = []
    sm = inv_.split_mode.text if inv_.split_mode else None
    ts = inv_.tensor_split_values()
    if eng.name == "ik_llama.cpp":
        v = ik_ncmoe_value(inv_)
        if v is not None:
            n, order, src, flag = v
            take = ncmoe_take(eng, model, n, n_devices=n_devices, split_mode=sm, ngl=inv_.n_gpu_layers(),
                              tensor_split=ts, layer_devices=layer_devices)
            out.append((take, f"{flag}{'' if flag == '--cpu-moe' else f' {n}'} ({src})", order))
        return out
    for _flag, order, src in inv_.cpu_moe:
        out.append((NcmoeTake(999, "all", (), (cpu_moe_pattern(eng),)), f"--cpu-moe ({_src(src)})", order))
    for _flag, n, order, src in inv_.n_cpu_moe:
        out.append((ncmoe_take(eng, model, n), f"--n-cpu-moe {n} ({_src(src)})", order))
    return out


def _item_origin(it: RawItem, k: int) -> str:
    where = config_where(it.source.value)
    return f"-ot item {k + 1}" + (f" (config {where})" if where else "")


def engine_items(inv_: Invocation, model: Inventory, n_devices: int = 1,
                 layer_devices: Sequence[int] | None = None) -> list[tuple[str, str, str, int | None]]:
    """All items the engine tests, in order: (pattern, device, origin, raw item index or None).
    Raw items that the engine would reject are left out (the engine would not start).
    `n_devices`: the accelerators the engine uses (ik's --n-cpu-moe depends on it)."""
    eng = inv_.engine
    raw = inv_.items()
    user = [(it.pattern or "", it.device or "", _item_origin(it, k), k, it.source.order)
            for k, it in enumerate(raw) if it.pattern is not None]
    moe: list[tuple[str, str, str, int | None, int]] = []
    for take, origin, order in invocation_ncmoe(inv_, model, n_devices, layer_devices):
        for p in take.patterns:
            moe.append((p, HOST, origin, None, order))
    for _flag, n, order, src in inv_.n_cpu_ffn:  # one rule per block 0..n-1 (beyond the blocks: none match)
        for il in range(min(n, model.block_count)):
            moe.append((cpu_ffn_pattern(il), HOST, f"--n-cpu-ffn {n} ({src})", None, order))
    # ik: user rules first, then its --n-cpu-moe rules; mainline: sources in order
    merged = user + moe if eng.name == "ik_llama.cpp" else sorted(user + moe, key=lambda x: x[4])
    return [(p, d, o, k) for p, d, o, k, _ in merged]


def bench_invocations(words: Sequence[Arg], engine: Engine, *, limit: int | None = None,
                      ) -> tuple[BenchLine, list[Invocation]]:
    """A llama-bench line read once, and one invocation per test that places or allocates
    differently (each -ot set, -ngl, --n-cpu-moe, -ub, ... combination, at most `limit`), each
    read from the test's common-parser line (`BenchTest.words`) and carrying the line (`bench`).
    llama-bench reads neither the environment nor llama.cpp's config files."""
    from moeconf.engines.benchline import read_bench

    line = read_bench(words, engine)
    return line, bench_line_invocations(line, limit=limit)


def bench_line_invocations(line: BenchLine, *, limit: int | None = None) -> list[Invocation]:
    """bench_invocations of a line already read (engines/benchline.py read_bench): not read again."""
    from moeconf.engines.benchline import MAX_TESTS

    out = []
    for test in line.tests(placement_only=True, limit=MAX_TESTS if limit is None else limit):
        inv = parse_invocation(test.words(), line.engine)
        inv.bench = line
        inv.bench_test = test
        out.append(inv)
    return out
