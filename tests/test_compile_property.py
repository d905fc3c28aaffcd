"""Property tests: for random inventories and random plans, the compiled rules reproduce the
resolved placement exactly, under Python `re` and under ECMAScript (the `regress` engine); and
every target's output gives back the same `-ot` value."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeconf.compile import compile_plan
from moeconf.engines.simulate import ecmascript_matcher, python_matcher, simulate
from moeconf.plan import plan_from_text
from tests.strategies import inventories, plan_text, rules
from tests.test_emit import extract_ot_all_targets

CONFIGS = [
    # (engine, extra TOML, devices the rules may use)
    ("llama.cpp", "", None),
    ("llama.cpp", "[flags]\ntensor_split = [1, 1]\n", None),
    ("llama.cpp", "[flags]\nn_gpu_layers = 7\ntensor_split = [2, 1]\n", None),
    ("ik_llama.cpp", "", None),
    ("ik_llama.cpp", "[flags]\nn_gpu_layers = 5\n", None),
    ("ik_llama.cpp", "[flags]\nsplit_mode = \"graph\"\ntensor_split = [1, 1]\n", None),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_compiled_rules_reproduce_the_placement(data: st.DataObject) -> None:
    inv = data.draw(inventories())
    engine, extra, _ = data.draw(st.sampled_from(CONFIGS))
    rule_list = data.draw(st.lists(rules(inv), min_size=0, max_size=5))
    plan = plan_from_text(plan_text(rule_list, engine, extra), "/tmp/random-plan.toml")
    c = compile_plan(plan, inventory=inv)
    want = {n: d for n, d in c.placement.devices.items() if d is not None}
    for matcher in (python_matcher, ecmascript_matcher):
        sim = simulate(inv, c.synthesis.items, c.placement.defaults, matcher)
        got = {n: d for n, d in sim.devices.items() if d is not None}
        assert got == want, (rule_list, c.ot)
    # no item is there for nothing: each is the first match of some tensor it moves
    assert all(h > 0 for h in sim.hits), (rule_list, c.ot, sim.hits)
    for it in c.synthesis.items:
        assert not any(ch in it.pattern for ch in ",= \t{}"), it.pattern
    if c.synthesis.items:
        for target, value in extract_ot_all_targets(c).items():
            assert value == c.ot, target


# --- no longer than an exhaustive search over the readable forms ---------------------------------
#
# The readable forms (docs/plans.md, "What the compiler emits"): an item's regex is an alternation of
# terms; a term is a whole name part (every occurrence in every name of the model sits between
# `.`/`_` separators or the ends), or a block term PREFIX(R)\.K with PREFIX `blk\.` or `\.`, R the
# layer-set regex of any set of blocks, K empty or `.*PART`. Layouts: one item per device that
# needs one, each matching only tensors that want its device (direct), or a one-term broad item
# last whose over-match one item per other device catches first (carved). The search below is
# independent of the synthesizer: every term's matches come from `re.search` over the names, and
# each item is an exact minimum-cost cover by dynamic programming.

import itertools  # noqa: E402
import re  # noqa: E402

from moeconf.engines import AUTO_GPU  # noqa: E402
from moeconf.model.inventory import Inventory, ModelMetadata, RawTensor, build_inventory  # noqa: E402
from moeconf.synth.layers import layer_set_regex  # noqa: E402
from moeconf.synth.rules import escape  # noqa: E402

MOE_KINDS = ["attn_norm", "attn_q_a", "attn_k_b", "attn_kv_a_mqa", "ffn_gate_inp", "ffn_up_exps",
             "ffn_down_exps", "ffn_gate_exps", "ffn_up_shexp", "exp_probs_b"]
DENSE_KINDS = ["attn_norm", "attn_q_a", "ffn_up", "ffn_down", "ffn_gate"]


@st.composite
def small_inventories(draw: st.DrawFn) -> Inventory:
    n = draw(st.integers(1, 4))
    lead = draw(st.integers(0, min(1, n - 1)))
    moe = draw(st.lists(st.sampled_from(MOE_KINDS), min_size=1, max_size=4, unique=True))
    if not any(k.endswith("_exps") for k in moe):
        moe.append("ffn_down_exps")
    dense = draw(st.lists(st.sampled_from(DENSE_KINDS), min_size=1, max_size=3, unique=True))
    tops = ["token_embd", *draw(st.lists(st.sampled_from(["output_norm", "output"]), unique=True))]
    raw = [RawTensor(t + ".weight", "F32", (32,), 128) for t in tops]
    for il in range(n):
        for k in (dense if il < lead else moe):
            suffix = ".bias" if k == "exp_probs_b" else ".weight"
            raw.append(RawTensor(f"blk.{il}.{k}{suffix}", "F32", (32,), 128))
    md = ModelMetadata(arch="deepseek2", block_count=n, expert_count=8, expert_used_count=2,
                       leading_dense_block_count=lead or None)
    return build_inventory(md, raw, source="small")


def _bounds(s: str) -> set[int]:
    out = {0, len(s)}
    for k, ch in enumerate(s):
        if ch in "._":
            out |= {k, k + 1}
    return out


def _parts(s: str) -> set[str]:
    b = sorted(_bounds(s))
    return {s[i:j] for x, i in enumerate(b) for j in b[x + 1:] if s[i:j].strip("._")}


def _readable(p: str, names: list[str]) -> bool:
    for nm in names:
        bounds = _bounds(nm)
        for m in re.finditer("(?=" + re.escape(p) + ")", nm):
            if m.start() not in bounds or m.start() + len(p) not in bounds:
                return False
    return True


def readable_terms(inv: Inventory, live: list[str]) -> dict[int, int]:
    """Every readable term, as {match bitmask over `live`: shortest length}."""
    all_names = [t.name for t in inv.tensors]
    # parts of the names around the block numbers (a layer number is only ever written bounded)
    rest_parts = {p for t in inv.tensors if t.layer is not None
                  for p in _parts(t.name.split(".", 2)[2]) if _readable(p, all_names)}
    parts = rest_parts | {p for t in inv.tensors if t.layer is None for p in _parts(t.name)
                          if _readable(p, all_names)} | {"blk", "blk."}
    blocks = sorted({t.layer for t in inv.tensors if t.layer is not None})
    regexes = [escape(p) for p in parts]
    for k in range(1, len(blocks) + 1):
        for layer_set in itertools.combinations(blocks, k):
            r = layer_set_regex(layer_set, set(blocks) - set(layer_set))
            for kind in ["", *(".*" + escape(p) for p in rest_parts)]:
                regexes += [r"blk\." + r + r"\." + kind, r"\." + r + r"\." + kind]
    out: dict[int, int] = {}
    for rx in regexes:
        c = re.compile(rx)
        mask = sum(1 << i for i, nm in enumerate(live) if c.search(nm))
        if mask and len(rx) < out.get(mask, 10**9):
            out[mask] = len(rx)
    return out


def min_alternation(must: int, allowed: int, terms: dict[int, int]) -> int | None:
    """Shortest alternation of terms matching all of `must` and nothing outside `allowed`."""
    usable = {m & must: c for m, c in terms.items() if m & must and not m & ~allowed}
    best: dict[int, int] = {}
    for m, c in usable.items():
        best[m] = min(best.get(m, 10**9), c)
    # DP over the subsets of `must` reachable as unions of terms
    dist = {0: -1}
    frontier = [0]
    while frontier:
        nxt = []
        for cov in frontier:
            for m, c in best.items():
                u = cov | m
                d = dist[cov] + c + 1
                if d < dist.get(u, 10**9):
                    dist[u] = d
                    nxt.append(u)
        frontier = nxt
    return dist.get(must)


def exhaustive_length(pl: object) -> int:
    from moeconf.placement import Placement

    assert isinstance(pl, Placement)
    inv = pl.inventory
    live = [t.name for t in inv.tensors if pl.devices[t.name] is not None]
    want: dict[str, int] = {}
    need = 0
    for i, nm in enumerate(live):
        d = pl.devices[nm]
        assert d is not None
        want[d] = want.get(d, 0) | 1 << i
        if d != pl.defaults[nm]:
            need |= 1 << i
    if not need:
        return 0
    terms = readable_terms(inv, live)
    auto = want.get(AUTO_GPU, 0)
    devices = [d for d in want if d != AUTO_GPU]
    need_of = {d: need & want[d] for d in devices if need & want[d]}
    inf = 10**9
    best = inf
    direct = 0
    for d, m in need_of.items():
        c = min_alternation(m, want[d], terms)
        direct = inf if c is None else direct + c + len(d) + 2
    best = min(best, direct - 1)
    for b_dev, b_need in need_of.items():
        for bmask, bcost in terms.items():
            if b_need & ~bmask or bmask & auto:
                continue
            total = bcost + len(b_dev) + 1
            for d in devices:
                if d == b_dev:
                    continue
                catch = need_of.get(d, 0) | (bmask & want[d])
                if catch:
                    c = min_alternation(catch, want[d], terms)
                    total = inf if c is None else total + c + len(d) + 2
            best = min(best, total)
    return best


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_no_longer_than_exhaustive_search_over_readable_forms(data: st.DataObject) -> None:
    inv = data.draw(small_inventories())
    engine, extra, _ = data.draw(st.sampled_from(CONFIGS))
    rule_list = data.draw(st.lists(rules(inv), min_size=1, max_size=4))
    plan = plan_from_text(plan_text(rule_list, engine, extra), "/tmp/random-plan.toml")
    c = compile_plan(plan, inventory=inv)
    bound = exhaustive_length(c.placement)
    assert len(c.ot) <= bound, (rule_list, c.ot, bound)


def test_wrong_masks_never_reach_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search runs on bitmasks; if they ever disagreed with the regexes, a list they chose
    would fail the real re-simulation, and a longer one that passes (at worst exact names) is
    printed, never a wrong rule."""
    import moeconf.synth.rules as synth_rules
    from tests.conftest import EXAMPLES

    plan = plan_from_text(
        f'rules = ["experts -> cpu", "experts first 10 -> gpu"]\n[model]\n'
        f'path = "{EXAMPLES}/models/kimi-k2.manifest.json"\nserve_path = "/m.gguf"\n', "/tmp/lie.toml")
    honest = compile_plan(plan)
    assert honest.ot == r"\.(\d|10)\.=CUDA0,exps=CPU"
    # a lying mask: `exps` claims to match only the experts of layers 11-60
    real = synth_rules._Space.sub_mask

    def lying(self: synth_rules._Space, s: str) -> int:
        m = real(self, s)
        if s == "exps":
            m &= ~sum(1 << i for i, nm in enumerate(self.names) if any(f"blk.{k}." in nm for k in range(11)))
        return m

    monkeypatch.setattr(synth_rules._Space, "sub_mask", lying)
    c = compile_plan(plan)
    assert c.ot != honest.ot and "exps=CPU" not in c.ot.split(",")
    sim = simulate(c.inventory, c.synthesis.items, c.placement.defaults)
    assert all(sim.devices[n] == d for n, d in c.placement.devices.items() if d is not None)


# --- counterexamples the property once found, kept as deterministic cases ----------------------


def _small(blocks: int, kinds: list[str], tops: list[str], lead: int = 0,
           dense: list[str] | None = None) -> Inventory:
    raw = [RawTensor(t + ".weight", "F32", (32,), 128) for t in tops]
    for il in range(blocks):
        for k in (dense or [] if il < lead else kinds):
            suffix = ".bias" if k == "exp_probs_b" else ".weight"
            raw.append(RawTensor(f"blk.{il}.{k}{suffix}", "F32", (32,), 128))
    md = ModelMetadata(arch="deepseek2", block_count=blocks, expert_count=8, expert_used_count=2,
                       leading_dense_block_count=lead or None)
    return build_inventory(md, raw, source="small")


EARLIER_MATCHES = [
    # (inventory, engine, extra TOML, rules, the -ot); the later item may match what an earlier
    # one already took: `\.[12]\.` takes the experts of blocks 1-2 too, but `ffn` got them first
    # (it used to exclude them: `\.[12]\..*attn=CPU`, 33 characters)
    (_small(3, ["attn_norm", "ffn_down_exps"], ["token_embd"]), "llama.cpp", CONFIGS[1][1],
     ["embd, experts, norm layers 1.. -> cpu", "embd, experts -> gpu1"], r"ffn|embd=CUDA1,\.[12]\.=CPU"),
    # the CPU item first: then `ffn` and `blk` need not spare blocks 0-1 (in the device order,
    # CPU last, the best is `\.[23]\.attn=CUDA1,\.[01]\.=CPU,blk=CUDA0`, 41 characters)
    (_small(4, ["attn_q_a", "attn_k_b", "ffn_down_exps"], ["token_embd"], lead=1, dense=["attn_norm", "ffn_up"]),
     "ik_llama.cpp", CONFIGS[4][1],
     ["layer, norm, attn_norm layers 0..1 -> gpu1", "norm, ffn_down_exps first 5 -> gpu", "attn layers moe -> CUDA1",
      "all, attn layers 0..1 -> cpu"], r"\.[01]\.=CPU,ffn=CUDA0,blk=CUDA1"),
]


@pytest.mark.parametrize(("inv", "engine", "extra", "rule_list", "ot"), EARLIER_MATCHES,
                         ids=[f"case{k}" for k in range(len(EARLIER_MATCHES))])
def test_later_items_may_match_what_earlier_items_took(
        inv: Inventory, engine: str, extra: str, rule_list: list[str], ot: str) -> None:
    plan = plan_from_text(plan_text(rule_list, engine, extra), "/tmp/random-plan.toml")
    c = compile_plan(plan, inventory=inv)
    assert c.ot == ot
    assert len(c.ot) <= exhaustive_length(c.placement)
    for matcher in (python_matcher, ecmascript_matcher):
        sim = simulate(inv, c.synthesis.items, c.placement.defaults, matcher)
        assert all(sim.devices[n] == d for n, d in c.placement.devices.items() if d is not None)
        assert all(h > 0 for h in sim.hits)


def test_many_devices_try_the_reverse_order() -> None:
    """Six items (beyond the orders tried in full): the device order and its reverse are both
    tried; in the reverse one, each GPU's block term may take what the items before it took
    (the device order alone gave 200 characters of kind-by-kind carving)."""
    from tests.conftest import EXAMPLES

    rule_list = ["experts -> cpu", "layers ..9 -> gpu", "layers 10..19 -> gpu1", "attn layers 20..29 -> gpu2",
                 "experts layers 30..39 -> gpu3", "norm -> gpu4"]
    plan = plan_from_text(
        "rules = [" + ", ".join(f'"{r}"' for r in rule_list) + "]\n"
        '[engine]\ngpus = ["CUDA0", "CUDA1", "CUDA2", "CUDA3", "CUDA4"]\n'
        f'[model]\npath = "{EXAMPLES}/models/deepseek-v3.manifest.json"\nserve_path = "/m.gguf"\n', "/tmp/six.toml")
    c = compile_plan(plan)
    assert c.ot == r"norm=CUDA4,\.3\d\..*exps=CUDA3,\.2\d\.attn=CUDA2,\.1\d\.=CUDA1,\.\d\.=CUDA0,exps=CPU"
    sim = simulate(c.inventory, c.synthesis.items, c.placement.defaults, ecmascript_matcher)
    assert all(sim.devices[n] == d for n, d in c.placement.devices.items() if d is not None)


def test_exact_names_need_no_end_anchor_where_no_name_extends_one() -> None:
    """The exact-names fallback (a placement no readable term reproduces) anchors each name at the start, and
    at the end only where a name is the start of another: a `$` cannot be written in a .env value, so a plan
    compiled to the env target refused (found by the property test above: GLM-5's blk.0.attn_q_b beside
    blk.0.indexer.attn_q_b on a one-block model)."""
    from moeconf.synth.rules import exact_names

    names = ["blk.0.attn_q_b.weight", "blk.0.indexer.attn_q_b.weight", "blk.0.attn_q_b.weight_scale"]
    assert exact_names(names[:1], names[:2]) == r"^(blk\.0\.attn_q_b\.weight)"
    # a name that starts another keeps the end anchor: without it the pattern would match both
    assert exact_names(names[:1], names) == r"^(blk\.0\.attn_q_b\.weight)$"
    pattern = exact_names(names[:1], names[:2])
    assert [n for n in names[:2] if re.search(pattern, n)] == names[:1]


def test_a_plan_falling_back_to_exact_names_compiles_to_every_target() -> None:
    raw = [RawTensor(n, "F32", (32,), 128) for n in (
        "token_embd.weight", "output_norm.weight", "output.weight", "blk.0.attn_norm.weight",
        "blk.0.attn_q_a.weight", "blk.0.attn_q_b.weight", "blk.0.indexer.attn_q_b.weight",
        "blk.0.indexer.attn_k.weight", "blk.0.indexer.k_norm.weight", "blk.0.indexer.proj.weight",
        "blk.0.attn_kv_a_mqa.weight", "blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight", "blk.0.attn_output.weight",
        "blk.0.ffn_norm.weight", "blk.0.ffn_gate_inp.weight", "blk.0.exp_probs_b.weight",
        "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight",
        "blk.0.ffn_gate_shexp.weight", "blk.0.ffn_up_shexp.weight", "blk.0.ffn_down_shexp.weight")]
    md = ModelMetadata(arch="glm-dsa", block_count=1, expert_count=8, expert_used_count=2)
    inv = build_inventory(md, raw, source="one-block-glm-dsa")
    plan = plan_from_text(plan_text(["attn_q_b -> cpu"], "llama.cpp", ""), "/tmp/one-block-plan.toml")
    c = compile_plan(plan, inventory=inv)
    assert "$" not in c.ot, c.ot
    for target, value in extract_ot_all_targets(c).items():
        assert value == c.ot, target
