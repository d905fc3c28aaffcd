"""What each engine (and version) accepts and does, as data plus small functions.

Lint rules, the resolver and the emitters ask this module; they do not hard-code engine facts.
`ik_llama.cpp` is described as llama.cpp plus its differences (the sqlglot idea: a table of
differences on a shared base). Sources: `shared/engine-facts.md` and the engines' code.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

EngineName = Literal["llama.cpp", "ik_llama.cpp"]

# The device a tensor gets when the engine spreads layers over several GPUs by their free memory:
# which GPU is not knowable from the files, so it is never the target of a compiled rule.
AUTO_GPU: Final = "GPU(auto)"

# The engines' name for the host (system memory and its CPU backend) in `-ot` rules and buffer names.
HOST: Final = "CPU"

# Newest mainline build these facts were read from; a plan without a version targets it: the
# pinned llama-cpp-python 0.3.36 vendors ggml-org/llama.cpp 0c1e57098 (its CHANGELOG.md), release
# b11312 of 2026-10-01 (the package carries no build number: b11312 is that commit's release tag).
# Its argument parser is engines/flagtable.py MAINLINE; the rest of the mainline facts were read
# through b10573 and found unchanged in it where the engine suite checks them.
NEWEST_MAINLINE_BUILD: Final = 11312

# ik_llama.cpp has no release numbers in git: moeconf names an ik_llama.cpp version either by a
# PyPI package version it knows (below) or by the date of the ik_llama.cpp commit it was built
# from, YYYY-MM-DD (`git log -1 --format=%cs`). Each fact below carries the date of the pull
# request that introduced it. Dates are modelled from the oldest code read (0.1.5's) on; a date
# past the newest code read gets the newest code's facts.
IK_PACKAGES: Final = {"0.1.5": "2026-04-13"}  # ik-llama-cpp-python 0.1.5 vendors ik commit 55d3c05bf
IK_OLDEST_DATE: Final = "2026-04-13"
IK_NEWEST_DATE: Final = "2026-08-15"  # ik commit 8337e4cd3, the newest code read
IK_NEWEST_COMMIT: Final = "8337e4cd3"  # engines/flagtable_iknewest.py and ikbuilds.py are read from it
IK_PR_OUTPUT_ON_GPU_PARTIAL_NGL: Final = "2026-05-23"  # PR #1869: -sm none/graph/attn, any -ngl > 0
IK_PR_AUTO_NGL: Final = "2026-07-30"  # PR #2209: -ngl defaults to 999; -ngl 0 drops -ot and -ncmoe
IK_PR_NCMOE_LAST: Final = "2026-08-07"  # PR #2262: one device: the last N layers with experts


@dataclass(frozen=True)
class Engine:
    """An engine at a version. `build` is mainline's build number (bNNNN); `date` is the date of
    the ik_llama.cpp commit (from a package version, IK_PACKAGES, or a build number, ikbuilds)."""

    name: EngineName
    version: str | None
    build: int | None
    date: str | None
    # -ot parsing
    max_overrides: int | None
    # env
    env_override_tensor: bool  # LLAMA_ARG_OVERRIDE_TENSOR
    env_cpu_moe: bool  # LLAMA_ARG_CPU_MOE / LLAMA_ARG_N_CPU_MOE
    env_split: bool  # LLAMA_ARG_SPLIT_MODE / LLAMA_ARG_TENSOR_SPLIT / LLAMA_ARG_RPC
    # --n-cpu-moe N on one device: the first N block indices (dense blocks included), or the last
    # N layers with routed experts
    ncmoe_takes: Literal["first", "last"]
    ncmoe_skips_nextn: bool
    ncmoe_pattern_has_gate_up: bool
    # what follows the expert kinds in ik's one-device pattern: r"\.weight" (biases stay) or
    # r"\.(weight|scale)"; "" for mainline's `_(ch|)exps` with no suffix
    ncmoe_suffix: str
    # ik: with 2+ devices in -sm layer and N < block count, N is shared over the devices in
    # proportion to their layer counts and each device gives up its own last layers
    ncmoe_per_device: bool
    # -ngl: does N count the output layer (mainline) or only repeating blocks (ik)
    ngl_counts_output: bool
    ngl_words: bool  # auto / all
    default_ngl: int  # what the engine does without -ngl (-1: "auto", all layers when fit is off)
    # --fit
    has_fit: bool
    fit_default_on: bool
    fit_with_overrides: Literal["absent", "gives-up", "error"]
    # nextn / MTP blocks: does the loader create (and so place) their tensors
    creates_nextn_tensors: bool
    # names
    rpc_indexed: bool  # RPC0[host:port] (b6688+) rather than RPC[host:port]
    rpc_repeats_add: bool  # a second --rpc adds servers (mainline) or replaces the first (ik)
    metal_name: str  # MTL0 (b7917+) or Metal
    has_merge_qkv: bool
    has_merge_up_gate: bool
    split_modes: tuple[str, ...]
    fa_takes_value: bool  # -fa on|off|auto rather than a bare switch
    has_load_mode: bool  # -lm/--load-mode (mainline b10108+; --no-mmap/--mlock deprecated)
    ot_needs_gpu: bool  # ik: -ngl 0 or no GPU drops every -ot and --n-cpu-moe rule
    output_on_gpu_any_ngl_modes: tuple[str, ...]  # ik: split modes where any -ngl > 0 offloads the output
    fit_flag: str  # how to write fit off/on: "-fit" (takes on|off) or "--fit" (a bare switch)
    # ik_llama.cpp before 2025-09-01 (build 3870) read each comma-separated -ot item with
    # `stream >> word`: leading/trailing whitespace dropped, an item ends at its first space, a
    # trailing comma adds no item
    ot_items_read_as_words: bool = False

    @property
    def label(self) -> str:
        return self.name + (f" {self.version}" if self.version else "")

    # -- buffer-type names -------------------------------------------------------------------

    def device_name_error(self, name: str) -> str | None:
        """Why `name` is not a buffer-type name this engine's `-ot` accepts, or None."""
        if _DEVICE_RE.fullmatch(name) or name == HOST or name in ("OpenCL",):
            if name.startswith("RPC"):
                m = _RPC_RE.fullmatch(name)
                if not m:
                    return f"{name!r} is not an RPC device name: write RPC0[host:port]"
                if self.rpc_indexed and not m.group(1):
                    return f"{self.label} names RPC devices RPC0[host:port] (since b6688), not {name!r}"
                if not self.rpc_indexed and m.group(1):
                    return f"{self.label} names RPC devices RPC[host:port], not {name!r}"
                return None
            if name.startswith("MTL") and self.metal_name == "Metal":
                return f"{self.label} names the Metal device 'Metal' (MTL0 since b7917)"
            if name == "Metal" and self.metal_name != "Metal":
                return f"{self.label} names the Metal device MTL0 (since b7917), not 'Metal'"
            return None
        return _explain_bad_device(name)


_DEVICE_RE = re.compile(
    r"CPU|(?:CUDA|ROCm|MUSA|Vulkan|SYCL|CANN|MTL)\d+(?:_Private)?|Metal|OpenCL|RPC\d*\[[^\],=\s]+\]"
)
_RPC_RE = re.compile(r"RPC(\d*)\[([^\]:,=\s]+):(\d+)\]")
_KNOWN_PREFIXES = ("CPU", "CUDA", "ROCm", "MUSA", "Vulkan", "SYCL", "CANN", "MTL", "Metal", "OpenCL", "RPC")


def _explain_bad_device(name: str) -> str:
    if "$" in name:
        return f"{name!r} holds an unexpanded variable"
    low = name.lower()
    if low in ("cpu_repack", "cpu_mapped", "amx", "cpu_aarch64") or low.endswith("_host"):
        return f"{name!r} is a host/extra buffer type, which -ot does not accept: write CPU"
    for p in _KNOWN_PREFIXES:
        if low.startswith(p.lower()):
            rest = name[len(p):]
            if name[: len(p)] != p:
                fixed = p + rest
                return f"buffer-type names are case-sensitive: did you mean {fixed!r}?"
            if rest in ("", "x", "X", "N", "n", "#") and p not in ("CPU", "Metal", "OpenCL"):
                return f"{name!r} needs a device index: {p}0, {p}1, ..."
    return f"{name!r} is not a buffer-type name (CPU, CUDA0, ROCm0, Vulkan0, SYCL0, MTL0, RPC0[host:port], ...)"


def _parse_build(version: str | None) -> int | None:
    if version is None:
        return None
    # a build number has at most 9 digits (b<5000 digits> is not one, and would not convert)
    m = re.fullmatch(r"b?(\d{1,9})", version.strip())
    return int(m.group(1)) if m else None


def mainline(version: str | None = None) -> Engine:
    build = _parse_build(version)
    b = build if build is not None else NEWEST_MAINLINE_BUILD
    return Engine(
        name="llama.cpp", version=version, build=b, date=None,
        max_overrides=4095,
        env_override_tensor=b >= 7536, env_cpu_moe=b >= 6586, env_split=True,
        ncmoe_takes="first", ncmoe_skips_nextn=False, ncmoe_pattern_has_gate_up=b >= 8307,
        ncmoe_suffix="", ncmoe_per_device=False,
        ngl_counts_output=True, ngl_words=b >= 7556, default_ngl=-1,
        has_fit=b >= 7416, fit_default_on=b >= 7416,
        fit_with_overrides="gives-up" if b >= 7416 else "absent",
        creates_nextn_tensors=False,
        rpc_indexed=b >= 6688, rpc_repeats_add=True, metal_name="MTL0" if b >= 7917 else "Metal",
        has_merge_qkv=False, has_merge_up_gate=False,
        split_modes=("none", "layer", "row", "tensor") if b >= 8740 else ("none", "layer", "row"),
        fa_takes_value=b >= 6325,
        has_load_mode=b >= 10108,
        ot_needs_gpu=False,
        output_on_gpu_any_ngl_modes=(),
        fit_flag="-fit",
    )


def ik_date(version: str | None) -> str:
    """The ik_llama.cpp commit date a version names (see IK_PACKAGES); the newest code read for
    None or a version moeconf cannot read (version_error says why)."""
    v = (version or "").strip().lstrip("v")
    if v in IK_PACKAGES:
        return IK_PACKAGES[v]
    build = _ik_build(v)
    if build is not None:
        v = ik_build_date(build)
    if _DATE_RE.fullmatch(v):
        # before the oldest code read: its facts are the closest known (engine-facts.md)
        return max(min(v, IK_NEWEST_DATE), IK_OLDEST_DATE)
    return IK_NEWEST_DATE


_DATE_RE = re.compile(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])")


def _ik_build(v: str) -> int | None:
    """An ik_llama.cpp build number as its log prints it (`build = 3871`), written b3871 or 3871."""
    m = re.fullmatch(r"b?(\d{1,9})", v)
    return int(m.group(1)) if m and int(m.group(1)) >= 1 else None


def ik_build_date(build: int) -> str:
    """The commit date of ik_llama.cpp build `build` (builds after the newest read: its date)."""
    from moeconf.engines.ikbuilds import IK_BUILD_DATES

    i = bisect.bisect_right(IK_BUILD_DATES, (build, "9999")) - 1
    return IK_BUILD_DATES[max(i, 0)][1]


def version_error(name: str, version: str | None) -> str | None:
    """Why `version` is not a version of engine `name` moeconf can model, or None."""
    if version is None:
        return None
    v = version.strip()
    if len(version) > 40:  # quoted by its start and end: the message stays one line
        version = f"{version[:20]}...{version[-8:]}"
    if name in ("ik_llama.cpp", "ik_llamacpp", "ik"):
        v = v.lstrip("v")
        if v in IK_PACKAGES or _ik_build(v) is not None:
            return None
        if _DATE_RE.fullmatch(v):
            # dates before the oldest code read take its facts (and the -ot word split before
            # 2025-09-01): see ik_date and ik_before_word_split_change
            return None
        return (f"ik_llama.cpp version {version!r}: write a package version ({', '.join(IK_PACKAGES)}), the build "
                "number its log prints (`build = 3871`: b3871) or the date of the ik_llama.cpp commit, YYYY-MM-DD "
                "(git log -1 --format=%cs)")
    if _parse_build(v) is None:
        return f"llama.cpp version {version!r}: write a build number like b7600"
    return None


def ik(version: str | None = None) -> Engine:
    """ik_llama.cpp at a version (package version or commit date; None: the newest code read)."""
    d = ik_date(version)
    return replace(
        mainline(None),
        name="ik_llama.cpp", version=version, build=None, date=d,
        max_overrides=None,
        env_override_tensor=False, env_cpu_moe=False, env_split=False,
        ncmoe_takes="last" if d >= IK_PR_NCMOE_LAST else "first",
        ncmoe_skips_nextn=d >= IK_PR_NCMOE_LAST,
        ncmoe_pattern_has_gate_up=True,
        ncmoe_suffix=r"\.(weight|scale)" if d >= IK_PR_NCMOE_LAST else r"\.weight",
        ncmoe_per_device=True,
        ngl_counts_output=False, ngl_words=False,
        default_ngl=999 if d >= IK_PR_AUTO_NGL else 0,
        has_fit=True, fit_default_on=False, fit_with_overrides="error",
        # without -mtp a nextn block's tensors are created TENSOR_SKIP ("model has unused tensor
        # ... -- ignoring"): not loaded, though an override line is logged for them first
        creates_nextn_tensors=False,
        rpc_indexed=True, rpc_repeats_add=False, metal_name="Metal",
        has_merge_qkv=True, has_merge_up_gate=True,
        split_modes=("none", "layer", "graph", "attn"),
        fa_takes_value=not ik_before(version, IK_FA_TAKES_VALUE_SINCE),
        has_load_mode=False,
        ot_needs_gpu=d >= IK_PR_AUTO_NGL,
        output_on_gpu_any_ngl_modes=("none", "graph", "attn") if d >= IK_PR_OUTPUT_ON_GPU_PARTIAL_NGL else (),
        fit_flag="--fit",
        ot_items_read_as_words=ik_before_word_split_change(version),
    )


# ik_llama.cpp commit d7882c3cf (2025-09-01, build 3870) replaced the `>> word` item reader
IK_WORD_SPLIT_UNTIL: Final = ("2025-09-01", 3870)
# ik_llama.cpp PR #944 (commit 874926800, 2025-11-13): `-fa` takes a value (on|off|auto|1|0; auto
# means on); before, it was a bare switch
IK_FA_TAKES_VALUE_SINCE: Final = "2025-11-13"


def ik_before(version: str | None, date: str) -> bool:
    """An ik_llama.cpp version (date, build number or package) from before `date`, read as
    given (ik_date clamps older dates to the oldest code read; facts that changed before it
    need the version as written)."""
    if not version:
        return False
    v = version.strip().lstrip("v")
    if v in IK_PACKAGES:
        return IK_PACKAGES[v] < date
    build = _ik_build(v)
    if build is not None:
        return ik_build_date(build) < date
    return bool(_DATE_RE.fullmatch(v)) and v < date


def ik_before_word_split_change(version: str | None) -> bool:
    """An ik_llama.cpp version given as a date (2025-08-31) or a build number (b3869, 3869)
    from before the -ot item reader stopped trimming whitespace."""
    if not version:
        return False
    v = version.strip()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        return v < IK_WORD_SPLIT_UNTIL[0]
    build = _ik_build(v)
    return build is not None and build < IK_WORD_SPLIT_UNTIL[1]


def engine_device_order(names: Sequence[str]) -> list[str]:
    """Local GPUs in the order the engine numbers them: by index within each backend (CUDA0
    before CUDA1, whatever order they were listed in), backends in the order first listed. `-ts`
    and `-mg` count devices in this order."""
    first: dict[str, int] = {}
    keyed = []
    for n in names:
        m = re.fullmatch(r"(\D+?)(\d+)((?:_Private)?)", n)
        prefix, idx = (m.group(1) + m.group(3), int(m.group(2))) if m else (n, -1)
        first.setdefault(prefix, len(first))
        keyed.append(((first[prefix], idx), n))
    return [n for _, n in sorted(keyed, key=lambda k: k[0])]


def engine(name: str, version: str | None = None) -> Engine:
    if name in ("llama.cpp", "llamacpp", "mainline"):
        return mainline(version)
    if name in ("ik_llama.cpp", "ik_llamacpp", "ik"):
        return ik(version)
    raise ValueError(f"unknown engine {name!r} (llama.cpp or ik_llama.cpp)")
