"""The layer split moeconf chooses for a fill over several GPUs (`-ts`), and how the split layer
is packed: the chosen ranges fit every budget, keep at least as many expert bytes on the GPUs
as a split proportional to the budgets, and every check refuses a wrong answer."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moeconf.fill
from moeconf.compile import Compiled, compile_plan
from moeconf.engines import engine
from moeconf.errors import PlanError
from moeconf.explanation import explain
from moeconf.fill import DoesNotFit, pack
from moeconf.memory.estimate import alloc_size
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.plan import plan_from_text

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
GiB = 1024**3
MiB = 1024**2


def _plan(model: str, budgets: tuple[int, int], flags: str, *, ts: list[int] | None = None,
          engine_name: str = "llama.cpp", split: bool = True) -> str:
    return (f'rules = ["experts -> gpu, gpu1, cpu"]\n[model]\npath = "{MODELS}/{model}.manifest.json"\n'
            f'serve_path = "/m.gguf"\n[engine]\nname = "{engine_name}"\ngpus = ["CUDA0", "CUDA1"]\n'
            f"[flags]\n{flags}\n" + (f"tensor_split = {ts}\n" if ts else "")
            + f'[budget]\ngpu = "{budgets[0]} GiB"\ngpu1 = "{budgets[1]} GiB"\n'
            + f'split = {"true" if split else "false"}\n')


def _compile(text: str, tmp: Path) -> Compiled:
    return compile_plan(plan_from_text(text, str(tmp / "plan.toml")))


def _gpu_expert_bytes(c: Compiled) -> int:
    return sum(t.nbytes for t in c.inventory.tensors if t.group == "experts"
               and c.placement.devices[t.name] not in (None, "CPU"))


def _layer_homes(c: Compiled) -> list[str]:
    """Each block's device from -ngl/-ts, read back from the compiled command line."""
    ex = explain(c.inventory, c.engine, list(c.argv), gpus=["CUDA0", "CUDA1"])
    homes: dict[int, str] = {}
    for t in c.inventory.tensors:
        d = ex.placement.defaults[t.name]
        if t.layer is not None and d is not None:
            homes.setdefault(t.layer, d)
    return [homes[il] for il in sorted(homes)]


# shipped manifests, two budgets each (GiB), the flags users run them with
# GLM-4.5-Air at 24 + 12 GiB, 32k: while the split search ranked its candidates on the phase model (removed),
# it missed the proportional split's ranges (22.19 GB of experts through the graph, its 13,35 21.82 GB); the
# search measures every split it tries through the graph now, the proportional one first
CASES = [
    ("glm-4.5-air", (14, 10), "ctx_size = 8192\ncache_type_k = \"q8_0\"\ncache_type_v = \"q8_0\""),
    ("glm-4.5-air", (24, 12), "ctx_size = 32768"),
    ("qwen3-30b-a3b", (8, 6), "ctx_size = 16384"),
    ("qwen3-235b-a22b", (24, 16), "ctx_size = 32768\ncache_type_k = \"q8_0\"\ncache_type_v = \"q8_0\""),
    ("deepseek-v3", (24, 24), "ctx_size = 16384"),
    ("gpt-oss-120b", (16, 8), "ctx_size = 32768"),
    ("llama-4-maverick", (24, 16), "ctx_size = 8192"),
]


def _case_id(case: object) -> str:
    model, budgets, _ = getattr(case, "values", case)  # a pytest.param or a plain tuple
    return f"{model}:{budgets[0]}+{budgets[1]}"


@pytest.mark.parametrize(("model", "budgets", "flags"), CASES, ids=[_case_id(c) for c in CASES])
def test_chosen_split_fits_and_keeps_at_least_the_proportional_splits_experts(
        model: str, budgets: tuple[int, int], flags: str, tmp_path: Path) -> None:
    c = _compile(_plan(model, budgets, flags), tmp_path)
    assert "-ts" in c.argv
    ts = [int(x) for x in c.argv[c.argv.index("-ts") + 1].split(",")]
    # the -ts value is the layer counts: each GPU holds one contiguous range, output layer last
    homes = _layer_homes(c)
    assert homes == ["CUDA0"] * ts[0] + ["CUDA1"] * (len(homes) - ts[0])
    assert sum(ts) == c.inventory.block_count + 1
    mem = c.memory
    assert "GPU(auto)" not in mem.devices
    for dev, b in zip(("CUDA0", "CUDA1"), budgets, strict=True):
        # within budget with the compute model's tolerance (16 MiB or 3% of compute) kept free
        m = mem.devices[dev]
        assert m.total + max(16 * MiB, m.compute * 3 // 100) <= b * GiB
    # the split fit used to write: proportional to each budget less the reserve
    proportional = [(b * GiB - GiB) // MiB for b in budgets]
    try:
        theirs = _gpu_expert_bytes(_compile(_plan(model, budgets, flags, ts=proportional), tmp_path))
    except DoesNotFit:
        theirs = 0
    assert _gpu_expert_bytes(c) >= theirs


@pytest.mark.parametrize(("model", "budgets", "flags"), [
    ("glm-4.5-air", (24, 12), "ctx_size = 32768"),
    ("qwen3-30b-a3b", (8, 6), "ctx_size = 16384"),
])
def test_the_walk_keeps_what_trying_every_split_finds(model: str, budgets: tuple[int, int], flags: str,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the search measures a few splits around the proportional one (`_Filler.walk`); trying every split
    # instead, each measured through the graph, puts no more experts on the GPUs (GLM-4.5-Air 24 + 12 GiB at
    # 32k: 22.19 GB both, the proportional split's too; the phase model's ranking once chose 21.82)
    import moeconf.fill as fill_mod

    ours = _compile(_plan(model, budgets, flags), tmp_path)

    def every(self: Any, at: Any, best: Any, j: int, pair: int, rank: Any) -> list[Any]:
        return [at(a) for a in range(1, pair)]

    monkeypatch.setattr(fill_mod._Filler, "walk", every)
    theirs = _compile(_plan(model, budgets, flags), tmp_path)
    assert _gpu_expert_bytes(ours) >= _gpu_expert_bytes(theirs) > 0


def test_compile_and_explain_agree_on_the_chosen_split(tmp_path: Path) -> None:
    c = _compile(_plan("glm-4.5-air", (14, 10), "ctx_size = 8192"), tmp_path)
    ex = explain(c.inventory, c.engine, list(c.argv), gpus=["CUDA0", "CUDA1"])
    assert ex.placement.devices == c.placement.devices
    assert not any(d == "GPU(auto)" for d in ex.placement.devices.values())
    # the chosen -ts is the plan's from then on: every target carries it (and is read back)
    ts = c.argv[c.argv.index("-ts") + 1]
    assert c.plan.config.flags.tensor_split == [float(x) for x in ts.split(",")]
    from moeconf.emitting.targets import emit

    assert f"LLAMA_ARG_TENSOR_SPLIT={ts}" in emit(c, "env")
    assert f"- '-ts'\n      - '{ts}'" in emit(c, "compose")


def test_a_user_tensor_split_is_kept_and_refused_with_the_shortfall_when_its_ranges_do_not_fit(
        tmp_path: Path) -> None:
    c = _compile(_plan("glm-4.5-air", (14, 10), "ctx_size = 8192", ts=[24, 24]), tmp_path)
    assert c.argv[c.argv.index("-ts") + 1] == "24,24"
    # 47 of 48 layers on the 6 GiB GPU: its always-active tensors and KV cache alone are over
    with pytest.raises(DoesNotFit, match=r"CUDA1 needs [\d,]+ MiB .* before any fill: [\d,]+ MiB over its 6,144 MiB"):
        _compile(_plan("glm-4.5-air", (14, 6), "ctx_size = 32768", ts=[1, 47]), tmp_path)


def test_no_split_fits_names_the_closest_and_the_shortfall(tmp_path: Path) -> None:
    with pytest.raises(DoesNotFit, match=r"no split of the layers over CUDA0, CUDA1 fits \(the closest is -ts "
                       r"\d+,\d+\); does not fit: .*MiB over its"):
        _compile(_plan("glm-4.5-air", (6, 4), "ctx_size = 65536"), tmp_path)


def test_every_gpu_needs_a_budget_to_choose_the_split(tmp_path: Path) -> None:
    text = _plan("glm-4.5-air", (14, 10), "ctx_size = 8192").replace('["experts -> gpu, gpu1, cpu"]',
                                                                      '["experts -> gpu, cpu"]')
    text = text.replace('gpu1 = "10 GiB"\n', "")
    with pytest.raises(PlanError, match=r"no \[budget\] for CUDA1: with several GPUs moeconf chooses -ts"):
        _compile(text, tmp_path)


@pytest.mark.parametrize(("model", "budgets", "flags"), [
    ("glm-4.5-air", (14, 10), "ctx_size = 8192"),
    ("qwen3-30b-a3b", (8, 6), "ctx_size = 16384"),
    ("minimax-m2", (24, 24), 'ctx_size = 32768\nflash_attn = "on"'),
])
def test_ik_gets_a_split_from_its_own_layer_sizes(model: str, budgets: tuple[int, int], flags: str,
                                                   tmp_path: Path) -> None:
    """ik_llama.cpp splits the sum of its layer sizes by -ts: the chosen value's split, predicted as
    ik's loader computes it, gives each GPU one range, and compile's re-simulation agrees."""
    c = _compile(_plan(model, budgets, flags, engine_name="ik_llama.cpp"), tmp_path)
    ts = c.argv[c.argv.index("-ts") + 1]
    ex = explain(c.inventory, c.engine, list(c.argv), gpus=["CUDA0", "CUDA1"])
    assert ex.placement.devices == c.placement.devices
    homes = _layer_homes(c)
    assert "GPU(auto)" not in homes and homes == sorted(homes), (ts, homes)
    for dev, b in zip(("CUDA0", "CUDA1"), budgets, strict=True):
        assert c.memory.devices[dev].total <= b * GiB
    assert _gpu_expert_bytes(c) > 0


def test_ik_split_that_cannot_be_predicted_is_refused_rather_than_unchecked(tmp_path: Path) -> None:
    # -mtp loads the nextn layers, which ik's split then weighs: not modelled
    text = _plan("glm-4.5-air", (14, 10), 'ctx_size = 8192\nextra = ["-mtp"]', engine_name="ik_llama.cpp")
    with pytest.raises(DoesNotFit, match=r"split of the layers over CUDA0, CUDA1 cannot be predicted here "
                       r"\(-mtp loads the nextn layers\)"):
        _compile(text, tmp_path)


def test_row_split_is_refused_rather_than_unchecked(tmp_path: Path) -> None:
    # -sm row: no layer ranges to choose, and without -ts the engine splits by free memory
    with pytest.raises(DoesNotFit, match="spread over CUDA0, CUDA1 by the engine's free memory"):
        _compile(_plan("glm-4.5-air", (14, 10), 'ctx_size = 8192\nsplit_mode = "row"'), tmp_path)


def test_a_split_whose_ranges_differ_from_its_counts_is_refused(tmp_path: Path) -> None:
    """The check that reads -ts back with the engine's semantics, handed wrong answers."""
    plan = plan_from_text(_plan("glm-4.5-air", (14, 10), "ctx_size = 8192"), str(tmp_path / "p.toml"))
    inv = load_inventory(plan.model_path)
    eng = engine("llama.cpp")
    f = moeconf.fill._Filler(plan, inv, eng, {}, [], {"CUDA0": 14 * GiB, "CUDA1": 10 * GiB},
                             moeconf.fill.plan_settings(plan, eng))
    assert f.check_ranges((24, 24), (24, 24))  # 48 = 47 blocks + the output layer
    for wrong in ((24, 23), (23, 25), (2, 1)):
        with pytest.raises(AssertionError, match="does not give each GPU the layers"):
            f.check_ranges((24, 24), wrong)
    # ik: the split is a prediction from its layer sizes; a value predicted to split elsewhere is
    # not used (the search skips it)
    ik_plan = plan_from_text(_plan("glm-4.5-air", (14, 10), "ctx_size = 8192", engine_name="ik_llama.cpp"),
                             str(tmp_path / "ik.toml"))
    ik = engine("ik_llama.cpp")
    g = moeconf.fill._Filler(ik_plan, inv, ik, {}, [], {"CUDA0": 14 * GiB, "CUDA1": 10 * GiB},
                             moeconf.fill.plan_settings(ik_plan, ik))
    assert g.check_ranges((20, 28), g.ts_for((20, 28)))  # 47 blocks and the output layer
    assert not g.check_ranges((20, 28), (1, 1)) and not g.check_ranges((20, 28), g.ts_for((21, 27)))


def test_the_search_refuses_a_split_the_engine_would_read_differently(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # an engine whose -ts semantics are not layer counts: the search must not emit its value
    real = moeconf.fill.default_layer_devices

    def shifted(*a, **kw):  # type: ignore[no-untyped-def]
        out = real(*a, **kw)
        return {il: out.get(il + 1, d) for il, d in out.items()}

    monkeypatch.setattr(moeconf.fill, "default_layer_devices", shifted)
    with pytest.raises(AssertionError, match="does not give each GPU the layers"):
        _compile(_plan("glm-4.5-air", (14, 10), "ctx_size = 8192"), tmp_path)


# --- packing the split layer ----------------------------------------------------------------


@pytest.fixture(scope="module")
def glm() -> Inventory:
    return load_inventory(MODELS / "glm-4.5-air.manifest.json")


def _layer_experts(inv: Inventory, il: int) -> list[str]:
    return [t.name for t in inv.tensors if t.layer == il and t.group == "experts"]


def test_gate_and_up_beat_down_when_they_use_the_room_better(glm: Inventory) -> None:
    names = _layer_experts(glm, 10)
    size = {glm.by_name[n].base: alloc_size(glm.by_name[n], "CUDA0") for n in names}
    assert size["ffn_down_exps"] > size["ffn_gate_exps"] and size["ffn_gate_exps"] + size["ffn_up_exps"] > size[
        "ffn_down_exps"]
    room = size["ffn_gate_exps"] + size["ffn_up_exps"] + 4 * MiB  # 800 MiB on GLM-4.5-Air
    got = {glm.by_name[n].base for n in pack(glm, names, "CUDA0", room)}
    assert got == {"ffn_gate_exps", "ffn_up_exps"}
    # the fixed order (down first) took down alone here: fewer bytes
    assert size["ffn_down_exps"] < room and size["ffn_down_exps"] + size["ffn_gate_exps"] > room
    # with -muge (ik merges up and gate only when both land together) gate and up go as one
    assert pack(glm, names, "CUDA0", size["ffn_gate_exps"] + MiB, merge_up_gate=True) == []
    assert {glm.by_name[n].base for n in pack(glm, names, "CUDA0", size["ffn_gate_exps"] + MiB)} == {
        "ffn_gate_exps"}


@settings(max_examples=200, deadline=None)
@given(layer=st.integers(1, 45), room=st.integers(-10, 2500).map(lambda m: m * MiB),
       device=st.sampled_from(["CUDA0", "RPC0[127.0.0.1:5000]"]))
def test_pack_takes_the_most_bytes_that_fit(glm: Inventory, layer: int, room: int, device: str) -> None:
    names = _layer_experts(glm, layer)
    got = pack(glm, names, device, room)
    used = sum(alloc_size(glm.by_name[n], device) for n in got)
    assert used <= max(room, 0) and set(got) <= set(names)
    best = max((sum(alloc_size(glm.by_name[n], device) for n in c) for r in range(len(names) + 1)
                for c in combinations(names, r) if sum(alloc_size(glm.by_name[n], device) for n in c) <= room),
               default=0)
    assert used == best


def test_a_packing_that_exceeds_the_room_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a packer that takes the whole layer whatever the room: the fill must not place it
    monkeypatch.setattr(moeconf.fill, "pack", lambda inv, names, dev, room, mug=False: list(names))
    with pytest.raises(AssertionError, match=r"the packing of CUDA0's split layer takes .* where .* are free"):
        _compile(_plan("glm-4.5-air", (14, 10), "ctx_size = 8192"), tmp_path)


def _measures(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the placements a fill measures through the graph (the cache of repeats left out)."""
    count = [0]
    real = moeconf.fill._Filler.measure

    def counted(self: Any, devs: Any, defaults: Any) -> Any:
        if (frozenset(devs.items()), frozenset(defaults.items())) not in self._measures:
            count[0] += 1
        return real(self, devs, defaults)

    monkeypatch.setattr(moeconf.fill._Filler, "measure", counted)
    return count


@pytest.mark.parametrize("guess", ["one layer", "six layers too many", "every layer"])
def test_the_settle_guess_only_saves_measures(guess: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GLM-5 at 24 + 16 GiB: the greedy fill's boundary (5 layers on GPU 0) leaves GPU 1 1.8 GiB over; the
    # bytes of the layers it gives up point to 14, which fits, 13 does not. A guess is always measured: a
    # wrong one (here one layer, six too many, all of them) costs measures, never the split
    plan = _plan("glm-5", (24, 16), "ctx_size = 8192")
    counted = _measures(monkeypatch)
    ours = _compile(plan, tmp_path)
    ours_measures = counted[0]
    real = moeconf.fill._Filler.layers_covering

    def wrong(self: Any, c: Any, j: int, dev: str, gives: int) -> int:
        k = real(self, c, j, dev, gives)
        return {"one layer": 1, "six layers too many": k + 6, "every layer": 10_000}[guess]

    monkeypatch.setattr(moeconf.fill._Filler, "layers_covering", wrong)
    counted[0] = 0
    theirs = _compile(plan, tmp_path)
    assert theirs.argv == ours.argv
    assert counted[0] > ours_measures


def test_a_larger_part_is_measured_only_where_it_could_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `_Filler.growth` skips the larger parts of a split layer that need more than the GPU's whole compute
    # buffer and margin could free. With every part up to one more tensor measured instead (its former
    # bound): the same fill on CUDA at -ub 2048 (whose compute sheds host experts' copies as they move) and
    # on GLM-5 over two RPC devices (no op offload: nothing to shed), there with fewer measures. A bound
    # that ignores the compute shed (the room alone) loses what the larger part gained on GLM-4.5-Air, so
    # the comparison is not empty
    from moeconf.fit import Budget, fit

    rpc = ["RPC0[127.0.0.1:50001]", "RPC0[127.0.0.1:50002]"]
    cases = [("glm-4.5-air", [Budget("CUDA0", 24 * GiB)], ["-c", "32768", "-ub", "2048", "-b", "2048"]),
             ("glm-5", [Budget(rpc[0], 24 * GiB), Budget(rpc[1], 16 * GiB)],
              ["-c", "8192", "--rpc", "127.0.0.1:50001,127.0.0.1:50002"])]

    def run(model: str, budgets: list[Budget], argv: list[str]) -> tuple[tuple[str, ...], int]:
        inv = load_inventory(MODELS / f"{model}.manifest.json")
        r = fit(inv, engine("llama.cpp"), budgets, argv, model_path=str(inv.source), plan_dir=str(tmp_path),
                reserve=GiB)
        return r.argv, _gpu_expert_bytes(r.compiled)

    counted = _measures(monkeypatch)
    ours, ours_measures = [], []
    for case in cases:
        counted[0] = 0
        ours.append(run(*case))
        ours_measures.append(counted[0])

    def former(self: Any, d: str, unit: Any, room: int, mem: Any) -> int:
        return room + max(alloc_size(self.inv.by_name[n], d) for n in unit)

    monkeypatch.setattr(moeconf.fill._Filler, "growth", former)
    theirs_measures = []
    for case, result in zip(cases, ours, strict=True):
        counted[0] = 0
        assert run(*case) == result
        theirs_measures.append(counted[0])
    assert theirs_measures[0] >= ours_measures[0] and theirs_measures[1] > ours_measures[1]

    def room_only(self: Any, d: str, unit: Any, room: int, mem: Any) -> int:
        return room

    monkeypatch.setattr(moeconf.fill._Filler, "growth", room_only)
    assert run(*cases[0])[1] < ours[0][1]
