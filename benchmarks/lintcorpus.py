"""The real-world lint corpus: an independent reference simulation, per-item problem labels, and
the scoring of moeconf's linter against them.

The reference simulation shares no code with moeconf's rules or simulator: it reads the model
manifests as JSON, splits `-ot` values itself, matches with `regress` (ECMAScript, searched,
first match wins) and places unmatched tensors by the engines' `-ngl` rule. The labels say what
is wrong with each item, judged against what the item's own text says it is for:

- unmatched: the item matches no tensor of the model (and the engine accepts it);
- refused: the engine will not start (no `=`, empty item, a regex std::regex rejects, a
  device name no backend has);
- layer-overreach: the item's layer number (the digits, classes and alternatives written where a
  block number stands, e.g. `blk\\.1`, `6.ffn`, `[1-4]\\.`) denotes a set of block numbers, and
  the item takes tensors of blocks outside that set;
- dot-widens: writing one of its unescaped `.` as `\\.` would change the set of tensors the item
  takes, and the escaped form still takes some (so the dot stood for a literal dot and let in more);
- always-active-to-cpu: the item sends to CPU tensors used on every token (attention, shared
  experts, router, norms, dense FFN) whose default is a GPU; `implicit` when the item's text
  names none of those kinds (a catch-all like `ffn.*=CPU`);
- shadowed / redundant: the item matches tensors but earlier items take every one of them, to a
  different device (shadowed: the order is wrong) or to the same device (redundant);
- sm-graph-overrides: ik_llama.cpp `-sm graph`/`-sm attn` with `-ot` and no `-smgs` (graph
  scheduling is silently turned off).
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus" / "realworld" / "launches.jsonl"
MODELS = REPO / "examples" / "models"

ALWAYS_ACTIVE_KINDS = re.compile(r"^(attn_|ffn_(up|down|gate)_shexp|ffn_gate_inp|exp_probs_b|ffn_norm"
                                 r"|post_attention_norm"
                                 r"|ffn_(up|down|gate)\.|attn_norm)")
ALWAYS_ACTIVE_WORDS = re.compile(r"attn|shexp|gate_inp|norm|ffn_(up|down|gate)(?!_)")
DEVICE = re.compile(r"CPU|(?:CUDA|ROCm|MUSA|Vulkan|SYCL|CANN|MTL)\d+|Metal|OpenCL|RPC\d*\[[^\]]+\]")
IK_TRIM_UNTIL = "2025-09-01"  # ik_llama.cpp split -ot values with `stream >> word` before this date
IK_TRIM_BUILD = 3870  # the first ik_llama.cpp build (commit count) without it
# ik_llama.cpp PR #2209 (2026-07-30): -ngl defaults to 999 (before: 0, nothing offloaded), and
# -ngl 0 drops every -ot rule (before: applied)
IK_AUTO_NGL_SINCE = "2026-07-30"
IK_PACKAGE_DATES = {"0.1.5": "2026-04-13"}


@dataclass(frozen=True)
class RefTensor:
    name: str
    layer: int | None
    kind: str


@cache
def model_tensors(model: str) -> tuple[tuple[RefTensor, ...], int]:
    data = json.loads((MODELS / f"{model}.manifest.json").read_text())
    out = []
    for t in data["tensors"]:
        m = re.match(r"blk\.(\d+)\.(.*)", t["name"])
        out.append(RefTensor(t["name"], int(m.group(1)) if m else None, m.group(2) if m else t["name"]))
    return tuple(out), int(data["metadata"]["block_count"])


@dataclass
class Launch:
    ot: list[str]
    flags: list[str]
    model: str
    engine: str
    version: str | None
    source: str
    index: int = 0


@dataclass
class RefItem:
    value: int
    index: int  # within its value
    text: str
    pattern: str | None
    device: str | None
    raw: str = ""  # the comma-separated part as written (before an old ik build trims it)
    takes: set[str] = field(default_factory=set)
    touches: set[str] = field(default_factory=set)
    problems: set[str] = field(default_factory=set)


def load_corpus(path: Path = CORPUS) -> list[Launch]:
    out = []
    for n, line in enumerate(path.read_text().splitlines()):
        d = json.loads(line)
        out.append(Launch(d["ot"], d["flags"], d["model"], d["engine"], d.get("version"), d["source"], n))
    return out


def ik_trims(launch: Launch) -> bool:
    if launch.engine != "ik_llama.cpp" or not launch.version:
        return False
    v = launch.version
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        return v < IK_TRIM_UNTIL
    m = re.fullmatch(r"b?(\d+)", v)
    return bool(m) and int(m.group(1)) < IK_TRIM_BUILD


def ik_auto_ngl(launch: Launch) -> bool:
    """ik_llama.cpp at or after PR #2209 (an unversioned line means the newest code)."""
    v = (launch.version or "").lstrip("v")
    v = IK_PACKAGE_DATES.get(v, v)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        return v >= IK_AUTO_NGL_SINCE
    m = re.fullmatch(r"b?(\d+)", v)
    return not m  # ik build numbers are all from before 2026-07


def split_items(launch: Launch) -> list[RefItem]:
    items = []
    for vi, value in enumerate(launch.ot):
        if ik_trims(launch):
            # getline on ',' then `>> word`: whitespace skipped, the item ends at a space, a
            # trailing comma gives no item
            parts = value.split(",")
            if parts and parts[-1] == "":
                parts = parts[:-1]
            texts = [(p.split() or [""])[0] for p in parts]
        else:
            parts = texts = value.split(",")
        for ii, text in enumerate(texts):
            pat, eq, dev = text.partition("=")
            it = RefItem(vi, ii, text, pat if eq else None, dev if eq else None, raw=parts[ii])
            if ik_trims(launch) and len(parts[ii].split()) > 1:
                it.problems.add("words-dropped")  # this build reads the first word, ignores the rest
            elif ik_trims(launch) and parts[ii] != text:
                it.problems.add("space-trimmed")  # this build drops it; newer ik and mainline would not
            items.append(it)
    return items


def compile_regex(pattern: str):  # type: ignore[no-untyped-def]
    import regress

    if re.search(r"\(\?<[=!a-zA-Z]|\(\?[imsx]|\\[pPAZz]|\(\?>", pattern):
        return None  # lookbehind, named groups, inline flags, \p, \A \Z, atomic: std::regex rejects
    try:
        return regress.Regex(pattern)
    except Exception:
        return None


def rpc_name_ok(launch: Launch, device: str) -> bool:
    """RPC devices are RPC[host:port] on mainline before b6688, RPC<n>[host:port] since (and on ik)."""
    if not device.startswith("RPC"):
        return True
    indexed = bool(re.match(r"RPC\d+\[", device))
    if launch.engine == "ik_llama.cpp":
        return indexed
    build = int(launch.version.lstrip("b")) if launch.version else 10**6
    return indexed == (build >= 6688)


def flag(flags: list[str], *names: str) -> str | None:
    for i, f in enumerate(flags):
        if f in names and i + 1 < len(flags):
            return flags[i + 1]
    return None


def default_on_gpu(launch: Launch, t: RefTensor, n_layer: int) -> bool:
    ngl_text = flag(launch.flags, "-ngl", "--n-gpu-layers", "--gpu-layers")
    ngl = 10**6 if ngl_text in (None, "all", "auto", "-1") else int(ngl_text)
    if ngl_text is None and launch.engine == "ik_llama.cpp" and not ik_auto_ngl(launch):
        ngl = 0
    if t.name.startswith("token_embd"):
        return False
    if launch.engine == "ik_llama.cpp":
        start = max(n_layer - ngl, 0)
        output = ngl > n_layer
    else:
        start = max(n_layer + 1 - ngl, 0)
        output = ngl >= 1
    if t.layer is None:
        return output
    return t.layer >= start


def simulate(items: list[RefItem], tensors: Iterable[RefTensor], cpu_moe: bool = False
             ) -> dict[str, int | None]:
    """tensor -> index (into items) of its first match; cpu_moe appends the --cpu-moe rule."""
    compiled = [(k, compile_regex(it.pattern)) for k, it in enumerate(items) if it.pattern is not None]
    extra = compile_regex(r"\.ffn_(up|down|gate)_exps") if cpu_moe else None
    out: dict[str, int | None] = {}
    for t in tensors:
        out[t.name] = None
        for k, rx in compiled:
            if rx is not None and rx.find(t.name) is not None:
                out[t.name] = k
                break
        else:
            if extra is not None and extra.find(t.name) is not None:
                out[t.name] = -1
    return out


_ATOM = r"(?:\d|\\d|\[\^?[^\]]*\]|\((?:\?:)?(?:[\d|\-]|\\d|\[\^?[^\]]*\])+\))[?*+]?"
_NUMRUN = re.compile(r"(?:(?<=blk\\\.)|(?<=blk\.)|(?<=^)|(?<=\^)|(?<=\\\.)|(?<=\|)|(?<=\())(?P<num>(?:" + _ATOM + r")+)"
                     r"(?=\\\.|\.|\)|$|_)")


def top_level_alternatives(pattern: str) -> list[str]:
    out, depth, cur, i, in_class = [], 0, "", 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            cur += pattern[i:i + 2]
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(cur)
            cur = ""
            i += 1
            continue
        cur += c
        i += 1
    return [*out, cur]


def intended_layers(pattern: str, n_layer: int) -> set[int] | None:
    """The block numbers the pattern's layer-number parts denote (union over them), or None
    when it has none. A number stands where a block number stands: after `blk.`, at the start,
    or as the first part of the name (`6.ffn`, `[1-4]\\.`)."""
    got: set[int] = set()
    found = False
    for m in _NUMRUN.finditer(pattern):
        num = m.group("num")
        before = pattern[: m.start()]
        if not (before.endswith(("blk\\.", "blk.")) or before in ("", "^", "(", "^(", "(?:")):
            continue
        try:
            rx = re.compile(r"(?:" + num + r")\Z")
        except re.error:
            continue
        nums = {n for n in range(max(n_layer, 1000)) if rx.match(str(n))}
        if nums:
            found = True
            got |= nums
    return got if found else None


def overreach(pattern: str, takes: Iterable[RefTensor], n_layer: int) -> bool:
    """Does the item take a tensor of a block its own layer numbers exclude?"""
    alts = []
    for alt in top_level_alternatives(pattern):
        rx = compile_regex(alt)
        if rx is not None:
            alts.append((rx, intended_layers(alt, n_layer)))
    for t in takes:
        if t.layer is None:
            continue
        fits = [meant for rx, meant in alts if rx.find(t.name) is not None]
        if fits and all(meant is not None and t.layer not in meant for meant in fits):
            return True
    return False


def unescaped_dots(pattern: str) -> list[int]:
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            in_class = True
        elif c == "]":
            in_class = False
        elif c == "." and not in_class and not (i + 1 < len(pattern) and pattern[i + 1] in "*+?{"):
            out.append(i)
        i += 1
    return out


def label(launch: Launch) -> tuple[list[RefItem], set[str]]:
    tensors, n_layer = model_tensors(launch.model)
    items = split_items(launch)
    launch_problems: set[str] = set()
    for it in items:
        if (it.pattern is None or it.text == "" or compile_regex(it.pattern) is None
                or not DEVICE.fullmatch(it.device or "") or not rpc_name_ok(launch, it.device or "")):
            it.problems.add("refused")
    cpu_moe = "--cpu-moe" in launch.flags or "-cmoe" in launch.flags
    if launch.engine == "ik_llama.cpp" and not ik_auto_ngl(launch) and flag(
            launch.flags, "-ngl", "--n-gpu-layers", "--gpu-layers") is None and any(
            it.device not in (None, "CPU") for it in items):
        launch_problems.add("nothing-offloaded")  # old ik: no -ngl offloads no layer (KV stays in RAM)
    if (launch.engine == "ik_llama.cpp" and ik_auto_ngl(launch)
            and flag(launch.flags, "-ngl", "--n-gpu-layers", "--gpu-layers") == "0"):
        for it in items:  # ik ignores every -ot rule when nothing is offloaded
            if not it.problems:
                it.problems.add("ot-ignored")
        return items, set()
    first = simulate(items, tensors, cpu_moe)
    for k, it in enumerate(items):
        rx = compile_regex(it.pattern) if it.pattern is not None else None
        it.touches = {t.name for t in tensors if rx is not None and rx.find(t.name) is not None}
        it.takes = {n for n, j in first.items() if j == k}
    by_name = {t.name: t for t in tensors}
    for k, it in enumerate(items):
        if "refused" in it.problems or it.pattern is None:
            continue
        if not it.touches:
            it.problems.add("unmatched")
            continue
        if not it.takes:
            others = {items[first[n]].device for n in it.touches if first[n] is not None and first[n] != -1}
            it.problems.add("redundant" if others == {it.device} else "shadowed")
            continue
        meant = intended_layers(it.pattern, n_layer)
        if meant is not None and overreach(it.pattern, (by_name[n] for n in it.takes), n_layer):
            it.problems.add("layer-overreach")
        for pos in unescaped_dots(it.pattern):
            escaped = it.pattern[:pos] + "\\." + it.pattern[pos + 1:]
            alt = [RefItem(x.value, x.index, x.text, escaped if j == k else x.pattern, x.device)
                   for j, x in enumerate(items)]
            first2 = simulate(alt, tensors, cpu_moe)
            takes2 = {n for n, j in first2.items() if j == k}
            if takes2 and takes2 != it.takes:
                it.problems.add("dot-widens")
                break
        if re.fullmatch(r"[a-z][a-z0-9_]*", it.pattern):
            # a bare name: meant is the tensor kind of that name (or the experts, for `exp`)
            kinds = {re.sub(r"\.(weight|bias|scale)$", "", t.kind) for t in tensors}
            taken_kinds = {re.sub(r"\.(weight|bias|scale)$", "", by_name[n].kind) for n in it.takes}
            if it.pattern in kinds and taken_kinds - {it.pattern}:
                it.problems.add("name-overreach")
            elif (it.pattern == "exp" and any(x.endswith("_exps") for x in taken_kinds)
                  and any(not x.endswith("_exps") for x in taken_kinds)):
                # `exp` taking routed experts means the experts; what else it takes is collateral
                # (when earlier items already placed the experts, it can only mean the rest)
                it.problems.add("name-overreach")
        if it.device == "CPU":
            active = [by_name[n] for n in it.takes
                      if ALWAYS_ACTIVE_KINDS.match(by_name[n].kind) and default_on_gpu(launch, by_name[n], n_layer)]
            if active:
                it.problems.add("always-active-to-cpu")
                if not ALWAYS_ACTIVE_WORDS.search(it.pattern) and meant is None:
                    it.problems.add("always-active-to-cpu:implicit")
    if launch.engine == "llama.cpp" and len(launch.ot) > 1 and (
            not launch.version or int(launch.version.lstrip("b")) >= 7464):
        launch_problems.add("repeated-ot")  # mainline prints "only last value will be used"
    fit = flag(launch.flags, "-fit", "--fit")
    manual = bool(launch.ot) or cpu_moe or flag(launch.flags, "--n-cpu-moe", "-ncmoe") is not None
    if (launch.engine == "llama.cpp" and (not launch.version or int(launch.version.lstrip("b")) >= 7416)
            and fit not in ("off", "0") and (manual or flag(launch.flags, "-ngl", "--n-gpu-layers"))):
        launch_problems.add("fit-conflict")  # fit on by default gives up on manual placement (b7416+)
    if launch.engine == "ik_llama.cpp" and ("--fit" in launch.flags) and manual:
        launch_problems.add("fit-conflict")  # ik refuses --fit with -ot
    sm = flag(launch.flags, "-sm", "--split-mode")
    if (launch.engine == "ik_llama.cpp" and sm in ("graph", "attn") and launch.ot
            and "-smgs" not in launch.flags):
        launch_problems.add("sm-graph-overrides")
    return items, launch_problems


# --- scoring -----------------------------------------------------------------------------------

# which problem types make a finding of each rule true (a finding on an item with none of them,
# or a launch-level finding on a launch without one, is a false positive)
RULE_TYPES: dict[str, set[str]] = {
    "unmatched-pattern": {"unmatched"},
    "space-in-list": {"unmatched", "refused", "space-trimmed", "words-dropped"},
    "trailing-comma": {"refused"},
    "missing-equals": {"refused"},
    "invalid-regex": {"refused"},
    "unsupported-regex-syntax": {"refused"},
    "unknown-device": {"refused"},
    "comma-in-pattern": {"refused", "unmatched"},
    "prefix-collision": {"layer-overreach"},
    "unescaped-dot": {"dot-widens"},
    "shadowed-rule": {"shadowed", "redundant"},
    "duplicate-rule": {"shadowed", "redundant"},
    "overbroad-catch-all": {"always-active-to-cpu:implicit"},
    "always-active-to-cpu": {"always-active-to-cpu"},
    "dense-layer-to-cpu": {"always-active-to-cpu"},
    "sm-graph-overrides": {"sm-graph-overrides"},
    "repeated-ot": {"repeated-ot"},
    "fit-conflict": {"fit-conflict"},
    "item-not-simulated": {"ot-ignored"},
    "ngl-conflict": {"nothing-offloaded"},
    "name-collision": {"name-overreach"},
}
# rules whose findings are about the whole launch line, judged by its launch-level problems
LAUNCH_RULES = {"sm-graph-overrides", "repeated-ot", "fit-conflict", "ngl-conflict"}
GROUPED = re.compile(r"\[and (\d+) more \S+ findings? in this -ot value\]$")
# only a note (info) is true of whitespace the engine version drops
INFO_ONLY = {"space-trimmed"}
# problems with which the engine still runs the line as its author meant
AS_INTENDED = {"space-trimmed", "always-active-to-cpu", "repeated-ot", "fit-conflict", "redundant"}
# a deliberate placement (the item names the kind or the blocks): a true finding, not a miss
NOT_RECALLED = {"always-active-to-cpu", "repeated-ot", "space-trimmed"}
# the problem types recall is measured on, and the rules that may find each
TYPE_RULES: dict[str, set[str]] = defaultdict(set)
for _rule, _types in RULE_TYPES.items():
    for _t in _types:
        TYPE_RULES[_t].add(_rule)


@dataclass
class Score:
    launches: int = 0
    values: int = 0
    items: int = 0
    models: int = 0
    sources: int = 0
    tp: Counter[str] = field(default_factory=Counter)
    fp: Counter[str] = field(default_factory=Counter)
    unjudged: Counter[str] = field(default_factory=Counter)
    found: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    errors_on_clean: list[str] = field(default_factory=list)
    false_positives: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)


HEADER_LINES = 1  # the directive line above each launch


def _write_launch(tmp: Path, launch: Launch) -> tuple[Path, list[tuple[int, int, int]]]:
    """A shell file for the launch (a directive names its engine, version and model), and each
    item's (start, end, item index) columns, 1-based, on the launch's line."""
    directive = f"# moeconf: engine={launch.engine} model={MODELS / (launch.model + '.manifest.json')}"
    if launch.version:
        directive += f" version={launch.version}"
    line = "llama-server -m m.gguf " + " ".join(shlex.quote(f) for f in launch.flags)
    spans: list[tuple[int, int, int]] = []
    k = 0
    items = split_items(launch)
    for vi, value in enumerate(launch.ot):
        line += " -ot "
        quoted = shlex.quote(value)
        base = len(line) + 1 + (1 if quoted != value else 0)
        pos = 0
        for it in items:
            if it.value != vi:
                continue
            raw = it.raw or it.text
            start = value.find(raw, pos) if raw else pos
            start = max(start, pos)
            end = start + max(len(raw), 1)
            spans.append((base + start, base + end, k))
            pos = end
            k += 1
        line += quoted
    path = tmp / f"launch{launch.index}.sh"
    path.write_text(directive + "\n" + line + "\n")
    return path, spans


def run_linter(launches: list[Launch]) -> dict[int, list[Any]]:
    """moeconf's findings for each launch (one lint run over all of them, no config)."""
    from moeconf.linting.linter import lint
    from moeconf.linting.model import Config

    out: dict[int, list[Any]] = {la.index: [] for la in launches}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {str(_write_launch(Path(tmp), la)[0]): la.index for la in launches}
        for f in lint(sorted(paths), config=Config()).findings:
            out[paths[f.path]].append(f)
    return out


def score(launches: list[Launch] | None = None) -> Score:
    launches = load_corpus() if launches is None else launches
    s = Score(launches=len(launches), values=len({v for la in launches for v in la.ot}),
              models=len({la.model for la in launches}), sources=len({la.source for la in launches}))
    findings = run_linter(launches)
    with tempfile.TemporaryDirectory() as tmp:
        for launch in launches:
            items, launch_problems = label(launch)
            s.items += len(items)
            _, spans = _write_launch(Path(tmp), launch)
            per_item: dict[int, set[str]] = defaultdict(set)
            launch_rules: set[str] = set()
            for f in findings[launch.index]:
                name = f.name  # type: ignore[attr-defined]
                col = f.column  # type: ignore[attr-defined]
                k = next((k for a, b, k in spans if a <= col <= b), None)
                types = RULE_TYPES.get(name)
                if types is None:
                    s.unjudged[name] += 1
                    continue
                here = items[k].problems if k is not None else launch_problems
                if k is None and name not in LAUNCH_RULES:
                    # a launch-level finding of an item rule: true if any item has the problem
                    here = set().union(*(it.problems for it in items)) if items else set()
                if f.severity != "info":  # type: ignore[attr-defined]
                    here = here - INFO_ONLY
                if here & types:
                    s.tp[name] += 1
                else:
                    s.fp[name] += 1
                    s.false_positives.append(f"{launch.source} [{launch.model}] {f.text()}")  # type: ignore[attr-defined]
                if k is not None:
                    per_item[k].add(name)
                    more = GROUPED.search(f.message)  # type: ignore[attr-defined]
                    if more:
                        # one finding for several items of one -ot value: the others it counts must
                        # have a problem of the rule's kind too, and are found by it
                        others = [j for j, x in enumerate(items) if j > k and x.value == items[k].value
                                  and (x.problems - (INFO_ONLY if f.severity != "info" else set())) & types]  # type: ignore[attr-defined]
                        claimed = int(more.group(1))
                        for j in others[:claimed]:
                            per_item[j].add(name)
                        if len(others) < claimed:
                            s.fp[name] += claimed - len(others)
                            s.false_positives.append(f"{launch.source}: {claimed - len(others)} of the grouped "
                                                     f"{name} findings have no labelled problem")
                        s.tp[name] += min(claimed, len(others))
                else:
                    launch_rules.add(name)
                real = set().union(launch_problems, *(it.problems for it in items)) - AS_INTENDED
                if f.severity == "error" and not real:  # type: ignore[attr-defined]
                    s.errors_on_clean.append(f"{launch.source}: {f.text()}")  # type: ignore[attr-defined]
            for k, it in enumerate(items):
                for p in it.problems:
                    s.total[p] += 1
                    if per_item[k] & TYPE_RULES.get(p, set()):
                        s.found[p] += 1
                    elif p not in NOT_RECALLED:
                        s.misses.append(f"{launch.source} [{launch.model}] {p}: {it.text!r}")
            for p in launch_problems:
                s.total[p] += 1
                if launch_rules & TYPE_RULES.get(p, set()):
                    s.found[p] += 1
                else:
                    s.misses.append(f"{launch.source} [{launch.model}] {p}")
    return s


def tables(s: Score) -> tuple[list[list[str]], list[list[str]]]:
    prec = [["rule", "findings", "true", "precision"]]
    for rule in sorted(set(s.tp) | set(s.fp)):
        n = s.tp[rule] + s.fp[rule]
        prec.append([rule, str(n), str(s.tp[rule]), f"{100 * s.tp[rule] / n:.0f}%"])
    n = sum(s.tp.values()) + sum(s.fp.values())
    prec.append(["all", str(n), str(sum(s.tp.values())), f"{100 * sum(s.tp.values()) / max(n, 1):.1f}%"])
    rec = [["problem", "labelled", "found", "recall"]]
    for p in sorted(s.total):
        if p in NOT_RECALLED:
            continue
        rec.append([p, str(s.total[p]), str(s.found[p]), f"{100 * s.found[p] / s.total[p]:.0f}%"])
    t = sum(n for p, n in s.total.items() if p not in NOT_RECALLED)
    f = sum(n for p, n in s.found.items() if p not in NOT_RECALLED)
    rec.append(["all", str(t), str(f), f"{100 * f / max(t, 1):.1f}%"])
    return prec, rec


# --- mutants: the corpus with the mistakes people make, put in on purpose ------------------------

def _mutations(value: str) -> list[tuple[str, str]]:
    out = []
    m = re.search(r"(blk\\\.(?:\d+|\[[^\]]*\]|\([^)]*\)))\\\.", value)
    if m:
        out.append(("unbounded layer number", value[:m.end() - 2] + value[m.end():]))
    if "," in value:
        out.append(("space after comma", value.replace(",", ", ")))
        items = value.split(",")
        out.append(("catch-all first", ",".join([items[-1], *items[:-1]])))
    if "\\." in value:
        out.append(("dots unescaped", value.replace("\\.", ".")))
    if "_exps" in value:
        out.append(("exp for exps", value.replace("_exps", "_exp", 1)))
    if "[0-9]" in value:
        out.append(("(0-9) for [0-9]", value.replace("[0-9]", "(0-9)", 1)))
    if "exps=CPU" in value and "ffn" not in value:
        out.append(("ffn catch-all", value.replace("exps=CPU", "ffn.*=CPU", 1)))
    return out


def mutants(launches: list[Launch] | None = None) -> list[tuple[str, Launch]]:
    """Each corpus launch with one mistake put into one of its values, deduplicated."""
    launches = load_corpus() if launches is None else launches
    out: list[tuple[str, Launch]] = []
    seen: set[tuple[str, ...]] = set()
    for la in launches:
        for vi, value in enumerate(la.ot):
            for what, mutated in _mutations(value):
                ot = [*la.ot[:vi], mutated, *la.ot[vi + 1:]]
                key = (la.model, la.engine, *la.flags, *ot)
                if key in seen or mutated == value:
                    continue
                seen.add(key)
                # spaces after commas on the newest builds, which keep them; other mistakes as posted
                version = None if what == "space after comma" and la.engine == "ik_llama.cpp" else la.version
                out.append((what, Launch(ot, la.flags, la.model, la.engine, version, la.source, len(out))))
    return out
