"""Budgets in plans: `[budget]` and fill rules (`experts -> gpu, gpu1, cpu`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeconf.compile import compile_plan
from moeconf.errors import MoeconfError
from moeconf.plan import plan_from_text

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
GiB = 1024**3


def _plan(tmp_path: Path, rules: list[str], budget: str, flags: str = "ctx_size = 32768",
          engine: str = "") -> str:
    rl = ", ".join(f'"{r}"' for r in rules)
    return (f'rules = [{rl}]\n[model]\npath = "{MODELS}/glm-4.5-air.manifest.json"\nserve_path = "/m.gguf"\n'
            f"{engine}[flags]\n{flags}\n{budget}")


def _compile(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    return compile_plan(plan_from_text(text, str(tmp_path / "plan.toml")))


def _expert_layers(c, dev: str) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted({t.layer for t in c.inventory.tensors if t.group == "experts" and c.placement.devices[t.name] == dev})


def test_fill_rule_fills_the_gpu_up_to_its_budget(tmp_path: Path) -> None:
    c = _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, cpu"], '[budget]\ngpu = "24 GiB"\n'))
    layers = _expert_layers(c, "CUDA0")
    assert layers == list(range(1, 1 + len(layers))) and len(layers) > 3
    assert c.memory.devices["CUDA0"].total <= 24 * GiB
    more = _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, cpu"], '[budget]\ngpu = "30 GiB"\n'))
    assert len(_expert_layers(more, "CUDA0")) > len(layers)


def test_policy_last_and_split(tmp_path: Path) -> None:
    c = _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, cpu"],
                                 '[budget]\ngpu = "24 GiB"\npolicy = "last"\n'))
    layers = _expert_layers(c, "CUDA0")
    assert layers and layers[-1] == 45 and layers == list(range(46 - len(layers), 46))
    s = _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, cpu"], '[budget]\ngpu = "24 GiB"\nsplit = true\n'))
    assert s.memory.devices["CUDA0"].weights > _compile(tmp_path, _plan(
        tmp_path, ["experts -> gpu, cpu"], '[budget]\ngpu = "24 GiB"\n')).memory.devices["CUDA0"].weights
    assert s.memory.devices["CUDA0"].total <= 24 * GiB


def test_two_gpus_in_preference_order(tmp_path: Path) -> None:
    text = _plan(tmp_path, ["experts -> gpu, gpu1, cpu"], '[budget]\ngpu = "24GiB"\nCUDA1 = "16GiB"\n',
                 flags="ctx_size = 16384\ntensor_split = [23, 15]", engine='[engine]\ngpus = ["CUDA0", "CUDA1"]\n')
    c = _compile(tmp_path, text)
    a, b = _expert_layers(c, "CUDA0"), _expert_layers(c, "CUDA1")
    assert a and b and max(a) < min(b)  # gpu fills first, gpu1 takes the next layers
    assert c.memory.devices["CUDA0"].total <= 24 * GiB and c.memory.devices["CUDA1"].total <= 16 * GiB


def test_single_device_rules_after_a_fill_are_fixed(tmp_path: Path) -> None:
    c = _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, cpu", "experts layers 40.. -> gpu"],
                                 '[budget]\ngpu = "30 GiB"\n'))
    layers = _expert_layers(c, "CUDA0")
    assert set(range(40, 46)) <= set(layers) and 1 in layers
    assert c.memory.devices["CUDA0"].total <= 30 * GiB


@pytest.mark.parametrize(("rules", "budget", "message"), [
    (["experts -> gpu, cpu"], "", r"add a \[budget\] table"),
    (["experts -> gpu, gpu1, cpu"], '[budget]\ngpu = "24GiB"\n', r"no \[budget\] for"),
    (["experts -> gpu, cpu"], '[budget]\ngpu = "lots"\n', "is not a size"),
    (["experts -> gpu, gpu, cpu"], '[budget]\ngpu = "24GiB"\n', "appears twice"),
    (["experts -> gpu, cpu"], '[budget]\ngpu = "8GiB"\n', "CUDA0 needs .* MiB over its 8,192 MiB budget"),
])
def test_budget_errors(tmp_path: Path, rules: list[str], budget: str, message: str) -> None:
    engine = '[engine]\ngpus = ["CUDA0", "CUDA1"]\n' if "gpu1" in rules[0] else ""
    with pytest.raises(MoeconfError, match=message):
        _compile(tmp_path, _plan(tmp_path, rules, budget, engine=engine))


def test_compile_json_has_memory(tmp_path: Path) -> None:
    c = _compile(tmp_path, _plan(tmp_path, ["experts -> cpu"], ""))
    mem = c.json()["memory"]
    assert set(mem["CPU"]) == {"weights", "kv", "compute", "reserve", "total"}  # type: ignore[index]
    assert mem["CUDA0"]["kv"] > 0  # type: ignore[index]


def test_the_last_device_budget_is_checked_after_the_fill(tmp_path: Path) -> None:
    """`cpu = ...` bounds what the GPUs leave in system RAM: before the fill every routed expert
    would be there, so it is checked once the GPU holds what fits (a 60 GiB RAM budget fits
    GLM-4.5-Air with 24 GiB on the GPU; 16 GiB does not, and the message says what would help)."""
    ok = _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, cpu"], '[budget]\ngpu = "24 GiB"\ncpu = "60 GiB"\n'))
    assert ok.memory.devices["CPU"].total <= 60 * GiB and ok.memory.devices["CUDA0"].total <= 24 * GiB
    assert _expert_layers(ok, "CUDA0")
    with pytest.raises(MoeconfError) as e:
        _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, cpu"], '[budget]\ngpu = "24 GiB"\ncpu = "16 GiB"\n'))
    msg = e.value.message
    assert "system RAM holds" in msg and "over its 16,384 MiB budget" in msg and "fewer layers on the GPU" not in msg
    # too little RAM even with more room on the GPU is the same error, never "before any fill"
    with pytest.raises(MoeconfError, match="once the devices before it in the rule hold all they can"):
        _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, cpu"], '[budget]\ngpu = "40 GiB"\ncpu = "8 GiB"\n'))
    # a GPU last in the rule takes the rest too
    with pytest.raises(MoeconfError, match=r"CUDA1 holds .* one more device at the end of the rule"):
        _compile(tmp_path, _plan(tmp_path, ["experts -> gpu, gpu1"], '[budget]\ngpu = "24 GiB"\ngpu1 = "24 GiB"\n',
                                 engine='[engine]\ngpus = ["CUDA0", "CUDA1"]\n'))


def test_a_budget_without_a_fill_rule_is_still_a_budget(tmp_path: Path) -> None:
    """A plan whose fixed rules put more on a device than its [budget] allows is refused, naming
    the device and the shortfall (review: it compiled with exit 0 and a negative free column)."""
    text = _plan(tmp_path, ["experts -> cpu"], '[budget]\ngpu = "4 GiB"\ncpu = "1 GiB"\n',
                 engine='[engine]\ngpus = ["CUDA0"]\n')
    with pytest.raises(MoeconfError) as e:
        _compile(tmp_path, text)
    msg = e.value.message
    assert "CUDA0 needs" in msg and "over its 4,096 MiB budget" in msg and "over its 1,024 MiB budget" in msg
    assert "for system RAM" in msg and "before any fill" not in msg
    ok = _compile(tmp_path, _plan(tmp_path, ["experts -> cpu"], '[budget]\ngpu = "40 GiB"\ncpu = "128 GiB"\n',
                                  engine='[engine]\ngpus = ["CUDA0"]\n'))
    assert ok.memory.devices["CUDA0"].total <= 40 * GiB
