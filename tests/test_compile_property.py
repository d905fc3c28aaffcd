"""Property tests: for random inventories and random plans, the compiled rules reproduce the
resolved placement exactly, under Python `re` and under ECMAScript (the `regress` engine); and
every target's output gives back the same `-ot` value."""

from __future__ import annotations

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
