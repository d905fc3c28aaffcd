"""ik_llama.cpp's layer split over 2+ devices when the user gives `-ts`, reproduced from what its
loader computes (src/llama.cpp, `get_layer_sizes` and the split in `llm_load_tensors`).

With `-ts` ik does not look at free memory: the split points are the cumulative, normalized
`-ts` values (float), and the devices take consecutive offloaded layers, in order, by a size per
layer: the bytes of the layer's tensors as the file stores them (not changed by `-ot` or
`--n-cpu-moe`, which ik applies later), plus ik's own additions (MLA `attn_kv_b` handling), plus
that layer's KV cache for the context, cache types and `-mla`; the output layer (when `-ngl`
exceeds the block count) weighs the output matrix plus the logits buffer less the largest
compute buffer. Each device starts with one compute buffer (`max_compute`, the largest per-layer
estimate) already loaded; a layer that crosses a device's split point goes to that device when
that leaves the total closer to the point. ik does this in float and double as written, and so
does this module (struct-rounded float32 where ik uses float).

Not predicted (ik's own split is then unknown, GPU(auto)): no `-ts` (or all zeros: free memory),
`--fit` (moves layers by free memory), `-mtp` (loads the nextn layers, not modelled), ik's
`--swa-compress`, and architectures whose tensor table is not listed below (recurrent layers
among them)."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from moeconf.engines import Engine, ik
from moeconf.engines.argvread import named_options
from moeconf.engines.options import IK_NO_FA
from moeconf.engines.settings import Q8_KV, read_cache_type
from moeconf.memory.cachetypes import cache_block
from moeconf.memory.geometry import per_layer
from moeconf.memory.ikmla import IK_PR_AMB_256
from moeconf.model import ggml
from moeconf.model.inventory import Inventory

# ik_llama.cpp's tensor-name table per architecture (LLM_TENSOR_NAMES, the `blk.%d.` entries in
# the order of the llm_tensor enum; identical in 0.1.5 and in the newest code read), reduced to
# what the layer sizes depend on: e routed experts, s shared experts, d dense FFN, n a layer norm
# (ATTN_NORM(_2), ATTN_OUT_NORM, ATTN_POST_NORM, FFN_NORM, FFN_POST_NORM, LAYER_OUT_NORM), o other.
_TABLES: dict[str, str] = {
    "deepseek2": "attn_q:o attn_output:o attn_norm:n ffn_gate_inp:o ffn_gate_inp_shexp:o ffn_norm:n ffn_gate:d "
                 "ffn_down:d ffn_up:d ffn_down_exps:e ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e "
                 "ffn_down_shexp:s ffn_gate_shexp:s ffn_up_shexp:s exp_probs_b:o attn_q_a:o attn_q_b:o "
                 "attn_kv_a_mqa:o attn_kq_a_mqa:o attn_kv_b:o attn_k_b:o attn_v_b:o attn_q_a_norm:o attn_kv_a_norm:o",
    "glm4moe": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n post_attention_norm:n ffn_gate_inp:o "
               "ffn_gate:d ffn_down:d ffn_up:d ffn_down_exps:e ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e "
               "ffn_down_shexp:s ffn_gate_shexp:s ffn_up_shexp:s exp_probs_b:o attn_q_norm:o attn_k_norm:o "
               "nextn.eh_proj:o nextn.embed_tokens:o nextn.enorm:o nextn.hnorm:o nextn.shared_head_head:o "
               "nextn.shared_head_norm:o",
    "gpt-oss": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n post_attention_norm:n attn_sinks:o "
               "ffn_gate_inp:o ffn_down_exps:e ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e",
    "llama": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n attn_rot_embd:o ffn_gate_inp:o ffn_norm:n "
             "ffn_gate:d ffn_down:d ffn_up:d ffn_down_exps:e ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e",
    "llama4": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n attn_rot_embd:o ffn_gate_inp:o ffn_norm:n "
              "ffn_gate:d ffn_down:d ffn_up:d ffn_down_exps:e ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e "
              "ffn_down_shexp:s ffn_gate_shexp:s ffn_up_shexp:s",
    "mistral3": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n attn_rot_embd:o ffn_gate_inp:o ffn_norm:n "
                "ffn_gate:d ffn_down:d ffn_up:d ffn_down_exps:e ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e",
    "qwen2moe": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n ffn_gate_inp:o ffn_gate_inp_shexp:o ffn_norm:n "
                "ffn_down_exps:e ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e ffn_down_shexp:s ffn_gate_shexp:s "
                "ffn_up_shexp:s",
    "qwen3moe": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n ffn_gate_inp:o ffn_norm:n ffn_down_exps:e "
                "ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e attn_q_norm:o attn_k_norm:o",
    "qwen3vlmoe": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n ffn_gate_inp:o ffn_norm:n ffn_down_exps:e "
                  "ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e attn_q_norm:o attn_k_norm:o",
    "ernie4_5-moe": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n ffn_gate_inp:o ffn_norm:n ffn_gate:d "
                    "ffn_down:d ffn_up:d ffn_down_exps:e ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e "
                    "ffn_down_shexp:s ffn_gate_shexp:s ffn_up_shexp:s exp_probs_b:o",
    "hunyuan-moe": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n ffn_gate_inp:o ffn_norm:n ffn_down_exps:e "
                   "ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e ffn_down_shexp:s ffn_gate_shexp:s "
                   "ffn_up_shexp:s attn_q_norm:o attn_k_norm:o",
    "minimax-m2": "attn_q:o attn_k:o attn_v:o attn_output:o attn_norm:n ffn_gate_inp:o ffn_norm:n ffn_down_exps:e "
                  "ffn_gate_exps:e ffn_up_exps:e ffn_gate_up_exps:e exp_probs_b:o attn_q_norm:o attn_k_norm:o",
}
TENSOR_TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    arch: tuple((e.rpartition(":")[0], e.rpartition(":")[2]) for e in text.split()) for arch, text in _TABLES.items()
}
# architectures whose per-layer compute in ik's log differs from get_layer_sizes as
# modelled here, measured on the tiny layouts (the split then lands one layer off)
_COMPUTE_UNMODELLED = {
    "qwen3vlmoe": "ik_llama.cpp's layer sizes for architecture 'qwen3vlmoe' are not modelled: its log shows "
                  "twice the per-layer compute moeconf computes (tiny-qwen3vlmoe: 1.50 against 0.75 MiB), which "
                  "moves the split",
}
_MLA_ARCHS = frozenset({"deepseek2", "glm-dsa", "mistral4"})  # ik's MLA architectures (with tables: deepseek2)

# ik PR #1657 (2026-04-19): tensor kinds by exact name (before: the first table entry, in enum
# order, whose name is a prefix: `ffn_up_exps` read as the dense `ffn_up` where the table has
# one), and biases (and `.scale`) no longer counted in the compute estimate (before: a check
# that never matched)
IK_PR_EXACT_TENSOR_KIND = "2026-04-19"
# ik PR #1870 (2026-05-24): MLA models with 0 < -ngl < block count run with -mla 3
IK_PR_MLA3_PARTIAL_NGL = "2026-05-24"
# ik PR #2194 (2026-07-28): output_hc_* / hc_head_* tensors count with the output layer
IK_PR_OUTPUT_HC = "2026-07-28"


def f32(x: float) -> float:
    """x rounded to the nearest float32 (what a C++ `float` holds)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


@dataclass(frozen=True)
class IkSplitSettings:
    """What ik's layer sizes depend on, as its command line sets them."""

    n_ctx: int = 0  # -c (0: the model's training context)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    mla: int = 3  # -mla
    n_batch: int = 2048  # -b
    n_ubatch: int = 512  # -ub (ik's loader gets min(-ub, -b, -c))
    amb: int | None = None  # -amb (None: the version's default)
    flash_attn: bool = True  # -fa on|off|auto (auto: on), -no-fa
    worst_graph_tokens: int = 0  # -wgt


def _ik_tables() -> tuple[dict[str, str], dict[str, str]]:
    """Spelling -> setting and variable -> setting for what IkSplitSettings holds, from the one
    option table (engines/options.py; the variables: those ik reads)."""
    import dataclasses

    from moeconf.engines.options import with_settings

    keys = {f.name for f in dataclasses.fields(IkSplitSettings)}
    rows = [o for o in with_settings() if o.setting in keys]
    return ({n: str(o.setting) for o in rows for n in o.names},
            {o.env: str(o.setting) for o in rows if o.ik_env})


_IK_VALUED, _IK_ENV = _ik_tables()
# flags after which ik moves layers by free memory or loads what is not modelled
UNPREDICTABLE_FLAGS = {"--fit": "--fit moves layers by free memory", "-mtp": "-mtp loads the nextn layers",
                       "--multi-token-prediction": "-mtp loads the nextn layers",
                       "--swa-compress": "--swa-compress is not modelled",
                       "--mmproj": "--mmproj changes the batch sizes"}


def read_ik_split_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> IkSplitSettings | str:
    """The settings from an ik_llama.cpp command line (binary first or not) and its env; a str
    says why the split cannot be predicted (a flag in UNPREDICTABLE_FLAGS, a value ik rejects)."""
    values: dict[str, str] = {}
    for k, v in (env or {}).items():
        if k in _IK_ENV:
            values[_IK_ENV[k]] = v
    for name, value in named_options(list(argv), _IK_VALUED):
        if name in UNPREDICTABLE_FLAGS:
            return UNPREDICTABLE_FLAGS[name]
        if name in IK_NO_FA:
            values["flash_attn"] = "off"
        elif name in _IK_VALUED and value is not None:
            values[_IK_VALUED[name]] = value
    out: dict[str, object] = {}
    for key, text in values.items():
        if key in ("cache_type_k", "cache_type_v"):
            t = read_cache_type(text, ik())
            if t is None:
                return f"cache type {text!r} is not one ik_llama.cpp accepts"
            out[key] = t
        elif key == "flash_attn":
            low = text.lower()
            if low in ("auto", "1", "on"):
                out[key] = True
            elif low in ("off", "0"):
                out[key] = False
            else:
                return f"-fa {text!r}: ik_llama.cpp takes on|off|auto"
        else:
            try:
                out[key] = int(text)
            except ValueError:
                return f"{key} {text!r} is not a number"
    return IkSplitSettings(**out)  # type: ignore[arg-type]


def _row_size(cache_type: str, n: int) -> int:
    """ggml_row_size for a cache type: bytes of n elements, rounded down as ggml_row_size does
    (ik's split weighs its own estimate, which takes widths no block divides: the tiny gpt-oss
    layout's q4_0 V splits otherwise; cachetypes.cache_row_bytes rounds up, as a real cache does)."""
    if cache_type == Q8_KV:
        return n + 8  # one byte per element plus ik's per-row scale
    block, size = cache_block(cache_type)
    return size * n // block


def _kind(table: tuple[tuple[str, str], ...], name: str, il: int, exact: bool) -> str | None:
    """ik's llm_tensor_type, reduced to a kind letter; None: unknown to the table."""
    for base, kind in table:
        full = f"blk.{il}.{base}"
        if exact:
            if name in (full + ".weight", full + ".bias", full):
                return kind
        elif name.startswith(full):  # .weight, .bias and the bare name are all prefixes of this
            return kind
    return None


@dataclass(frozen=True)
class LayerSizes:
    sizes: tuple[float, ...]  # per block, then the output layer (bytes, as ik's doubles hold them)
    max_compute: float


def layer_sizes(inv: Inventory, eng: Engine, s: IkSplitSettings, n_gpu_layers: int) -> LayerSizes | str:
    """ik's get_layer_sizes: per layer its weights (file bytes) plus KV cache, the output layer's
    weights plus logits less the largest compute buffer; and that largest compute buffer. A str
    says why it cannot be computed for this model."""
    md = inv.metadata
    table = TENSOR_TABLES.get(md.arch)
    if table is None:
        return f"ik_llama.cpp's layer sizes for architecture {md.arch!r} are not modelled"
    if md.arch in _COMPUTE_UNMODELLED:
        return _COMPUTE_UNMODELLED[md.arch]
    if md.embedding_length is None or md.head_count is None:
        return "the model's metadata lacks embedding_length or head_count"
    date = eng.date or ""
    exact = date >= IK_PR_EXACT_TENSOR_KIND
    n_layer = md.block_count
    has_mla = md.arch in _MLA_ARCHS
    mla_attn = s.mla
    if has_mla and date >= IK_PR_MLA3_PARTIAL_NGL and 0 < n_gpu_layers < n_layer and mla_attn != 3:
        mla_attn = 3
    amb = s.amb if s.amb is not None else (256 if date >= IK_PR_AMB_256 else 0)
    max_ctx = s.n_ctx or md.context_length or 0
    if max_ctx <= 0:
        return "the model's training context is unknown: give -c"
    # common's get_batch_ubatch: the batch is capped by the context, the u-batch by the batch
    ub = min(min(s.n_batch, s.n_ctx) if s.n_ctx > 0 else s.n_batch, s.n_ubatch)
    n_used = md.expert_used_count or 0
    n_nextn = md.nextn_predict_layers or 0
    result = [0.0] * (n_layer + 1)
    compute = [0.0] * (n_layer + 1)
    exps = [0] * n_layer
    shexp = [0] * n_layer
    dense = [0] * n_layer
    norm = [False] * n_layer
    mla: list[dict[str, tuple[int, ...]]] = [{} for _ in range(n_layer)]
    mla_types: dict[int, str] = {}
    mla_bytes: dict[int, int] = {}
    ow_size = embd_size = 0
    for t in inv.tensors:
        name = t.name
        size = t.nbytes
        if name == "token_embd.weight":
            embd_size = size
            continue
        if name == "output.weight":
            ow_size = ow_size + size if date >= IK_PR_OUTPUT_HC else size
            continue
        if date >= IK_PR_OUTPUT_HC and name.startswith(("output_hc_", "hc_head_")):
            ow_size += size
            continue
        if t.layer is None or not name.startswith("blk."):
            continue
        il = t.layer
        if il < 0 or il >= n_layer:
            continue
        if n_nextn > 0 and il >= n_layer - n_nextn:
            continue
        result[il] += size
        if exact and (name.endswith(".bias") or name.endswith(".scale")):
            continue
        shape = (*t.shape, 1, 1, 1)
        if has_mla and any(k in name for k in ("attn_k_b.weight", "attn_v_b.weight", "attn_kv_b.weight")):
            key = "k_b" if "attn_k_b.weight" in name else "v_b" if "attn_v_b.weight" in name else "kv_b"
            mla[il][key] = shape
            if key == "k_b":
                mla_types[il] = t.type
            if key == "kv_b":
                mla_bytes[il] = size
            continue
        kind = _kind(table, name, il, exact)
        if kind == "e":
            exps[il] += shape[1] * ub * n_used * 4
        elif kind == "s":
            shexp[il] += shape[1] * ub * 4
        elif kind == "d":
            dense[il] += shape[1] * ub * 4
        elif kind == "n":
            norm[il] = True
    inp_one = md.embedding_length * ub * 4
    for il in range(n_layer):
        ffn = max(exps[il], shexp[il], dense[il]) + (2 * inp_one if norm[il] else inp_one)
        compute[il] = max(compute[il], float(ffn))
    if has_mla:
        for il in range(n_layer):
            m = mla[il]
            if "k_b" in m and "v_b" in m and "kv_b" not in m:
                wk, wv = m["k_b"], m["v_b"]
                ktype = mla_types[il]
                qtype = "Q8_0" if _is_quantized(ktype) else ktype
                block, bsize = ggml.quant_sizes()[ggml.type_ids()[qtype]]
                row = bsize * wv[0] // block
                result[il] += row * (wv[1] + wk[1]) * wv[2] * 2
            elif "kv_b" in m:
                if "k_b" not in m:
                    result[il] += mla_bytes[il] // 2
                if "v_b" not in m:
                    result[il] += mla_bytes[il] // 2
            if mla_attn == 3 and "v_b" in m:
                wv = m["v_b"]
                kv_f32 = (2 * wv[1] * wv[2] * max_ctx * 4) / (1024.0 * 1024.0)
                n_head = wv[2]
                n_max_head = n_head
                if amb > 0 and kv_f32 > amb:
                    n_max_head = 1
                    for niter in range(2, n_head):
                        if n_head % niter == 0 and kv_f32 / niter <= amb:
                            n_max_head = n_head // niter
                            break
                compute[il] = max(compute[il], 2.0 * wv[1] * n_max_head * max_ctx * 4)
    if not ow_size:
        ow_size = embd_size
    result[n_layer] = float(ow_size)
    max_compute = 0.0
    for il in range(n_layer):
        kv = _cache_size(inv, il, s, mla_attn, max_ctx, has_mla)
        max_compute = max(max_compute, compute[il])
        result[il] += kv
    n_vocab = md.vocab_size or _vocab(inv)
    n_output = s.worst_graph_tokens if s.worst_graph_tokens > 0 else ub
    output_size = n_vocab * n_output * 4
    if output_size < max_compute:
        output_size = int(max_compute)
    output_size = int(output_size - max_compute)
    result[n_layer] += output_size
    return LayerSizes(tuple(result), max_compute)


def _is_quantized(type_name: str) -> bool:
    return type_name not in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")


def _vocab(inv: Inventory) -> int:
    emb = inv.by_name.get("token_embd.weight") or inv.by_name.get("output.weight")
    return emb.shape[1] if emb is not None and len(emb.shape) > 1 else 0


def _cache_size(inv: Inventory, il: int, s: IkSplitSettings, mla_attn: int, kv_size: int, has_mla: bool) -> int:
    """ik's llama_model::cache_size for block il (non-recurrent architectures)."""
    md = inv.metadata
    if has_mla and mla_attn:
        rope = md.rope_dimension_count or 0
        rank = md.kv_lora_rank or 0
        if s.flash_attn:
            return _row_size(s.cache_type_k, rank + rope) * kv_size
        kv_type = s.cache_type_k if mla_attn == 1 else s.cache_type_v
        size = _row_size(kv_type, rank + rope) * kv_size
        if mla_attn == 1:
            size += _row_size(s.cache_type_v, rank * kv_size)
        return size
    n_embd = md.embedding_length or 0
    n_head = per_layer(None, il, md.head_count or 1)
    n_head_kv = per_layer(md.head_count_kv, il, n_head)
    head_k = md.key_length or n_embd // n_head
    head_v = md.value_length or n_embd // n_head
    k_size = _row_size(s.cache_type_k, head_k) * n_head_kv * kv_size
    return k_size + _row_size(s.cache_type_v, head_v * n_head_kv) * kv_size


def split_points(tensor_split: Sequence[float], n_devices: int) -> list[float] | None:
    """ik's model.splits from -ts: cumulative, normalized, in float; None when every value is
    zero (ik then splits by free memory)."""
    ts = [f32(float(tensor_split[i])) if i < len(tensor_split) else 0.0 for i in range(n_devices)]
    if all(x == 0.0 for x in ts):
        return None
    acc = 0.0
    out = []
    for x in ts:
        acc = f32(acc + x)
        out.append(acc)
    return [f32(x / acc) for x in out]


def assign_layers(sizes: Sequence[float], max_compute: float, splits: Sequence[float], n_layer: int,
                  n_gpu_layers: int) -> list[int]:
    """ik's default device per block, then the output layer: each device, in order, takes the
    next layers while the running total (float) stays within its split point of the total
    (double); the layer crossing the point goes to it when that is closer."""
    n_devices = len(splits)
    out = [n_devices - 1] * (n_layer + 1)
    i_gpu_start = max(n_layer - n_gpu_layers, 0)
    n_last = n_layer + (1 if n_gpu_layers > n_layer else 0)
    total = max_compute * n_devices
    for i in range(i_gpu_start, n_last):
        total += sizes[i]
    last = i_gpu_start
    loaded = 0.0  # float
    for dev in range(n_devices):
        loaded = f32(loaded + max_compute)
        split_size = f32(splits[dev] * total)
        il = last
        while il < n_last:
            if loaded + sizes[il] <= split_size:
                out[il] = dev
                loaded = f32(loaded + sizes[il])
                il += 1
                continue
            if loaded + sizes[il] - split_size < f32(split_size - loaded):
                out[il] = dev
                loaded = f32(loaded + sizes[il])
                il += 1
            break
        last = il
    return out


def ik_layer_split(inv: Inventory, eng: Engine, settings: IkSplitSettings, n_gpu_layers: int,
                   tensor_split: Sequence[float], n_devices: int) -> list[int] | str:
    """ik_llama.cpp's default device index per block, then the output layer, over `n_devices`
    devices with `-ts tensor_split` (-sm layer); a str says why it cannot be predicted."""
    if n_devices < 2:
        return "one device: no split"
    splits = split_points(tensor_split, n_devices)
    if splits is None:
        return "-ts is all zeros: ik splits by free memory"
    n_layer = inv.block_count
    ngl = n_layer + 1 if n_gpu_layers < 0 else n_gpu_layers
    ls = layer_sizes(inv, eng, settings, ngl)
    if isinstance(ls, str):
        return ls
    return assign_layers(ls.sizes, ls.max_compute, splits, n_layer, ngl)
