"""The machine description (moeconf/machine.py, machine_cards.py, machine_detect.py): the card
table and how names find rows, the detection readers on recorded and wrong outputs, the value
forms, the merge (flags over plan over detection over table), the CLI and plan surfaces, and the
docs' copy of the table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from moeconf.cli import main
from moeconf.machine import (
    Detected,
    MachineValueError,
    machine_assumptions,
    machine_from,
    missing_lines,
    parse_bandwidth,
    parse_pcie,
    parse_ram,
    pcie_bytes,
    ram_bandwidth,
)
from moeconf.machine_cards import CARDS, CardUnknown, find_card
from moeconf.machine_detect import (
    SmiGPU,
    parse_cpuinfo,
    parse_dmidecode,
    parse_lscpu_cores,
    parse_meminfo,
    parse_nvidia_smi,
    probe_host_bandwidth,
    run,
)
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "machine"
MANIFEST = "examples/models/qwen3-30b-a3b.manifest.json"


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def smi(name: str) -> tuple[SmiGPU, ...]:
    gpus = parse_nvidia_smi(fixture(name))
    assert gpus is not None
    return tuple(gpus)


# ---- the card table ------------------------------------------------------------------------------

def test_every_row_has_sane_figures_and_a_source() -> None:
    keys = [c.key for c in CARDS]
    assert len(keys) == len(set(keys))
    assert len(CARDS) >= 30
    for c in CARDS:
        assert c.source.startswith("https://"), c.key
        assert c.checked is None or c.checked.startswith("https://"), c.key
        assert 100 <= c.memory_bandwidth <= 10_000, c.key
        assert c.pcie_gen in (3, 4, 5) and c.pcie_lanes in (8, 16), c.key
        assert 10 <= c.matrix_tflops <= 2_000, c.key
        assert c.first_hand or c.note, f"{c.key}: a derived or second-hand figure says how in its note"
    # the brief's cards are all there
    for key in ("RTX 3060 12GB", "RTX 3080 10GB", "RTX 3090", "RTX 3090 Ti", "RTX 4060 Ti 16GB", "RTX 4070 Ti SUPER",
                "RTX 4080", "RTX 4080 SUPER", "RTX 4090", "RTX 5060 Ti 16GB", "RTX 5070 Ti", "RTX 5080", "RTX 5090",
                "RTX A4000", "RTX A5000", "RTX A6000", "RTX 6000 Ada", "RTX PRO 6000 Blackwell", "L4", "L40S",
                "A100 40GB PCIe", "A100 80GB PCIe", "A100 40GB SXM", "A100 80GB SXM", "H100 PCIe", "H100 SXM", "H200",
                "V100 SXM2 16GB", "P40", "RX 7900 XTX", "MI100", "MI210"):
        assert key in keys, key


def test_a_row_reproduces_its_bandwidth_from_bus_and_speed() -> None:
    """Two rows recomputed from the memory's bus width and data rate (vendor specs): RTX 4090,
    384 bits at 21 Gbps; RTX 5090, 512 bits at 28 Gbps."""
    assert find_card("RTX 4090").memory_bandwidth == 384 / 8 * 21
    assert find_card("RTX 5090").memory_bandwidth == 512 / 8 * 28


@pytest.mark.parametrize(("name", "mib", "key"), [
    ("NVIDIA GeForce RTX 4090", 24564, "RTX 4090"),
    ("NVIDIA H200", 143771, "H200"),
    ("NVIDIA H100 80GB HBM3", 81559, "H100 SXM"),
    ("NVIDIA H100 PCIe", 81559, "H100 PCIe"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100 80GB SXM"),
    ("NVIDIA A100-PCIE-40GB", 40960, "A100 40GB PCIe"),
    ("NVIDIA A100 80GB PCIe", 81920, "A100 80GB PCIe"),
    ("Tesla V100-SXM2-16GB", 16160, "V100 SXM2 16GB"),
    ("Tesla P40", 24576, "P40"),
    ("NVIDIA GeForce RTX 3080", 10240, "RTX 3080 10GB"),
    ("NVIDIA GeForce RTX 3080", 12288, "RTX 3080 12GB"),
    ("GeForce RTX 3090", 24576, "RTX 3090"),  # older drivers leave out NVIDIA
    ("NVIDIA GeForce RTX 4070 Ti SUPER", 16376, "RTX 4070 Ti SUPER"),
    ("NVIDIA RTX 6000 Ada Generation", 49140, "RTX 6000 Ada"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887, "RTX PRO 6000 Blackwell"),
    ("NVIDIA GeForce RTX 2080", 7982, "RTX 2080"),
    ("NVIDIA GeForce RTX 2080 Ti", 11264, "RTX 2080 Ti"),
    ("NVIDIA GeForce RTX 2080 SUPER", 7982, "RTX 2080 SUPER"),
    ("NVIDIA L40S", 46068, "L40S"),
    ("NVIDIA GeForce RTX 5060 Ti", 16311, "RTX 5060 Ti 16GB"),
])
def test_nvidia_smi_names_find_their_row(name: str, mib: int, key: str) -> None:
    assert find_card(name, mib).key == key


@pytest.mark.parametrize(("name", "mib"), [
    ("NVIDIA GeForce RTX 4090 D", 24564),  # another card: fewer SMs
    ("NVIDIA GeForce RTX 4090 Laptop GPU", 16376),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 97887),  # lower clocks
    ("NVIDIA GeForce RTX 2080 Ti", 8192),  # a name with the wrong memory
    ("NVIDIA GeForce RTX 3060", 8192),  # the 8 GB 3060 has a narrower bus
    ("NVIDIA GeForce RTX 4060 Ti", 8188),  # the table's row is the 16 GB card
    ("NVIDIA GeForce RTX 4080", 24564),  # a name with the wrong memory
    ("4090", None), ("RTX", None), ("", None), ("NVIDIA", None),
])
def test_an_unknown_card_matches_no_row(name: str, mib: int | None) -> None:
    with pytest.raises(CardUnknown):
        find_card(name, mib)


def test_a_name_of_two_rows_needs_telling_apart() -> None:
    with pytest.raises(CardUnknown, match="RTX 3080 10GB or RTX 3080 12GB"):
        find_card("RTX 3080")
    assert find_card("RTX 3080 12GB").memory_bandwidth == 912


def test_the_docs_table_is_the_data() -> None:
    from moeconf.report.machine import render_cards

    text = (REPO / "docs" / "speed.md").read_text()
    m = re.search(r"<!-- cards: [^\n]*-->\n(.*?)<!-- /cards -->", text, re.S)
    assert m is not None, "docs/speed.md lost its card table markers"
    assert m.group(1) == render_cards(), "stale: regenerate the table with `moeconf machine --cards`"


# ---- detection readers ---------------------------------------------------------------------------

def test_nvidia_smi_lines_are_read() -> None:
    assert smi("nvidia-smi-h200.txt") == (SmiGPU(0, "NVIDIA H200", 143771, 5, 16),)
    two = smi("nvidia-smi-2x4090-units.txt")  # without nounits: "24564 MiB"
    assert [(g.index, g.memory_mib, g.pcie_lanes) for g in two] == [(0, 24564, 16), (1, 24564, 8)]
    assert smi("nvidia-smi-na.txt") == (SmiGPU(0, "NVIDIA H100 80GB HBM3", 81559, None, None),)


@pytest.mark.parametrize("text", [
    fixture("nvidia-smi-failed.txt"), fixture("nvidia-smi-header.txt"), "", "\n\n",
    "NVIDIA GeForce RTX 4090, 24564, 4\n",  # a field short
    "NVIDIA GeForce RTX 4090, lots, 4, 16\n", "NVIDIA GeForce RTX 4090, 24564, 9, 16\n",
    "NVIDIA GeForce RTX 4090, 24564, 4, 3\n", "NVIDIA GeForce RTX 4090, 24564, 4, 16\ngarbage\n",
])
def test_a_wrong_nvidia_smi_output_is_refused_whole(text: str) -> None:
    assert parse_nvidia_smi(text) is None


def test_cores_and_memory_readers() -> None:
    assert parse_lscpu_cores(fixture("lscpu-16c32t.txt")) == 16
    assert parse_lscpu_cores("0,0\nnot a line\n") is None
    assert parse_lscpu_cores("# only comments\n") is None
    assert parse_cpuinfo(fixture("cpuinfo-2s2c2t.txt")) == (4, "Intel(R) Xeon(R) Gold 6430")
    assert parse_cpuinfo(fixture("cpuinfo-arm64.txt")) == (None, None)  # no ids: lscpu or /sys then
    assert parse_meminfo("MemTotal:       24684084 kB\nMemFree: 1 kB\n") == 24684084 * 1024
    assert parse_meminfo("MemTotal: lots\n") is None


def test_dmidecode_reader() -> None:
    ddr5 = parse_dmidecode(fixture("dmidecode-ddr5-2ch.txt"))
    assert ddr5 is not None and (ddr5.kind, ddr5.speed_mts, ddr5.channels, ddr5.modules) == ("DDR5", 6000, 2, 2)
    ddr4 = parse_dmidecode(fixture("dmidecode-ddr4-4dimm-2ch.txt"))  # 4 modules on 2 channels
    assert ddr4 is not None and (ddr4.kind, ddr4.speed_mts, ddr4.channels, ddr4.modules) == ("DDR4", 3200, 2, 4)
    unnamed = parse_dmidecode(fixture("dmidecode-ddr4-unnamed.txt"))  # slots that do not name channels
    assert unnamed is not None and unnamed.channels is None and unnamed.modules == 4
    assert parse_dmidecode(fixture("dmidecode-mixed-speeds.txt")) is None
    assert parse_dmidecode(fixture("dmidecode-denied.txt")) is None
    assert parse_dmidecode("garbage") is None


def test_commands_that_fail_or_hang_give_nothing() -> None:
    assert run(("/nonexistent/nvidia-smi",)) is None
    assert run(("false",)) is None
    assert run(("sleep", "5"), timeout=0.2) is None
    assert run(("echo", "ok")) == "ok\n"


def test_detection_says_when_no_gpu_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    import moeconf.machine_detect as md

    monkeypatch.setattr(md, "run", lambda argv, timeout=md.TIMEOUT_S: None)  # no nvidia-smi, lscpu, dmidecode
    d = Detected.here()
    assert d.gpus is None
    assert any("no NVIDIA GPU reported" in n for n in d.notes)
    assert any("dmidecode" in n for n in d.notes)
    m = machine_from({}, ("CUDA0",), detect=d)
    assert m.gpus[0].name is None
    assert {"CUDA0: memory_bandwidth", "CUDA0: pcie_bandwidth", "CUDA0: matrix_flops"} <= set(m.missing())


def test_the_probe_measures_and_says_what() -> None:
    value, source = probe_host_bandwidth(seconds=0.05, threads=1)
    assert 1e8 < value < 1e13
    assert "lower bound" in source and "read + write" in source


# ---- values --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "value"), [("90GB/s", 90e9), ("1.5 TB/s", 1.5e12), ("900GiB/s", 900 * 2**30),
                                             ("936GB", 936e9)])
def test_bandwidth_forms(text: str, value: float) -> None:
    assert parse_bandwidth(text) == value


@pytest.mark.parametrize("text", ["90", "90 GB/h", "fast", "-1GB/s", "0GB/s", "90 Gb/s", ""])
def test_bandwidth_refusals(text: str) -> None:
    with pytest.raises(MachineValueError):
        parse_bandwidth(text)


def test_pcie_and_ram_forms() -> None:
    assert parse_pcie("4x16") == (4, 16) and parse_pcie("gen5") == (5, None) and parse_pcie("4.0x8") == (4, 8)
    assert pcie_bytes(4, 16) == pytest.approx(31.5e9, rel=1e-3)
    assert pcie_bytes(3, 16) == pytest.approx(15.75e9, rel=1e-3)
    assert pcie_bytes(5, 16) == pytest.approx(63.0e9, rel=1e-3)
    assert parse_ram("DDR5-6000x2") == ("DDR5", 6000, 2) and parse_ram("ddr4-3200x8") == ("DDR4", 3200, 8)
    assert ram_bandwidth(6000, 2) == 96e9 and ram_bandwidth(3200, 8) == 204.8e9
    for bad in ("4x3", "9x16", "x16", "pcie4"):
        with pytest.raises(MachineValueError):
            parse_pcie(bad)
    for bad in ("DDR5-6000", "DDR6-9000x2", "DDR5-600x2", "DDR4-3200x0", "DDR4-3200x99", "LPDDR5-6400x4"):
        with pytest.raises(MachineValueError):
            parse_ram(bad)


# ---- the merge -----------------------------------------------------------------------------------

def test_detected_h200_takes_the_table_row_and_the_link() -> None:
    m = machine_from({}, ("CUDA0",), detect=Detected(gpus=smi("nvidia-smi-h200.txt"), cores=(16, "/proc/cpuinfo")))
    g = m.gpus[0]
    assert (g.name, g.family, g.compute, g.pcie_link) == ("H200", "Hopper", "9.0", "PCIe 5.0 x16")
    assert g.memory_bandwidth is not None and g.memory_bandwidth.value == 4.8e12
    assert g.memory_bandwidth.source.startswith("table: H200 named by nvidia-smi (https://")
    assert g.pcie_bandwidth is not None and g.pcie_bandwidth.source == "nvidia-smi"
    assert g.matrix_flops is not None and g.matrix_flops.value == 989.5e12
    assert m.missing() == ["host: memory_bandwidth"]
    assert missing_lines(m) == ["host: memory_bandwidth: give --ram-speed DDR5-6000x2, --host-bandwidth 90GB/s or "
                                "--probe-ram"]


def test_a_slot_with_fewer_lanes_beats_the_table() -> None:
    m = machine_from({}, ("CUDA0", "CUDA1"), detect=Detected(gpus=smi("nvidia-smi-2x4090-units.txt")))
    assert [g.pcie_link for g in m.gpus] == ["PCIe 4.0 x16", "PCIe 4.0 x8"]
    assert machine_assumptions(m)[1].startswith("CUDA1 RTX 4090: memory 1,008 GB/s")


def test_flags_over_plan_over_detection_over_table() -> None:
    det = Detected(gpus=smi("nvidia-smi-2x4090-units.txt"), cores=(8, "lscpu"))
    plan = {"pcie": "3x16", "gpu_bandwidth": ["900GB/s", "800GB/s"], "cores": 12, "host_bandwidth": "60GB/s"}
    m = machine_from({"pcie": "5x4", "host_bandwidth": "70GB/s"}, ("CUDA0", "CUDA1"), plan, detect=det)
    assert [g.pcie_link for g in m.gpus] == ["PCIe 5.0 x4", "PCIe 5.0 x4"]
    assert [g.pcie_bandwidth.source for g in m.gpus if g.pcie_bandwidth] == ["--pcie", "--pcie"]
    assert [g.memory_bandwidth.value for g in m.gpus if g.memory_bandwidth] == [900e9, 800e9]
    bw0 = m.gpus[0].memory_bandwidth
    assert bw0 is not None and bw0.source == "plan [machine] gpu_bandwidth"
    assert m.host.cores is not None and (m.host.cores.value, m.host.cores.source) == (12, "plan [machine] cores")
    assert m.host.memory_bandwidth is not None and m.host.memory_bandwidth.value == 70e9
    # the generation alone keeps the lanes nvidia-smi reports
    m = machine_from({"pcie": "5"}, ("CUDA0", "CUDA1"), detect=det)
    assert [g.pcie_link for g in m.gpus] == ["PCIe 5.0 x16", "PCIe 5.0 x8"]
    assert m.gpus[1].pcie_bandwidth is not None
    assert m.gpus[1].pcie_bandwidth.source == "--pcie (generation), nvidia-smi (lanes)"
    # no detection: the flag's card alone
    m = machine_from({"gpu_model": "RTX 3090", "no_detect": True}, ("CUDA0",), detect=det)
    assert m.gpus[0].name == "RTX 3090" and m.host.cores is None


def test_cards_that_differ_are_not_matched_to_cuda_numbers() -> None:
    det = Detected(gpus=smi("nvidia-smi-mixed.txt"))
    m = machine_from({}, ("CUDA0", "CUDA1"), detect=det)
    assert all(g.name is None for g in m.gpus)
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in n for n in m.notes)
    m = machine_from({}, ("CUDA0", "CUDA1"), detect=Detected(gpus=det.gpus, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}))
    assert [g.name for g in m.gpus] == ["RTX 3090", "RTX 3060 12GB"]
    assert m.gpus[1].pcie_link == "PCIe 4.0 x4"
    m = machine_from({}, ("CUDA0",), detect=Detected(gpus=det.gpus, env={"CUDA_VISIBLE_DEVICES": "1"}))
    assert m.gpus[0].name == "RTX 3060 12GB"
    m = machine_from({}, ("CUDA0",), detect=Detected(gpus=det.gpus, env={"CUDA_VISIBLE_DEVICES": "GPU-1234"}))
    assert m.gpus[0].name is None and any("UUID" in n for n in m.notes)


def test_a_detected_card_the_table_lacks_gives_no_figures() -> None:
    for name in ("nvidia-smi-4090d.txt", "nvidia-smi-3060-8gb.txt"):
        m = machine_from({}, ("CUDA0",), detect=Detected(gpus=smi(name)))
        g = m.gpus[0]
        assert g.memory_bandwidth is None and g.matrix_flops is None and g.card is None, name
        assert any("not" in n and "--gpu-bandwidth" in n for n in m.notes), name
        assert g.pcie_link == "PCIe 4.0 x16"  # the link nvidia-smi reports still holds


@pytest.mark.parametrize(("fields", "says"), [
    ({"gpu_model": "RTX 4090 D"}, "--gpu-model: 'RTX 4090 D' is not in moeconf's card table"),
    ({"gpu_model": "RTX 4090,RTX 3090,RTX 3090"}, "--gpu-model: 3 values for 2 GPU(s)"),
    ({"gpu_model": "RTX 4090,"}, "--gpu-model: an empty item"),
    ({"pcie": "4x3"}, "--pcie: '4x3': a PCIe link has"),
    ({"gpu_bandwidth": "fast"}, "--gpu-bandwidth: 'fast' is not a bandwidth"),
    ({"gpu_tflops": "-3"}, "--gpu-tflops: '-3' is not a matrix rate"),
    ({"cores": "0"}, "--cores: '0' is not a number"),
    ({"ram_speed": "DDR5-6000"}, "--ram-speed: 'DDR5-6000' is not a RAM configuration"),
    ({"ram_speed": "DDR5-6000x2", "host_bandwidth": "90GB/s"}, "give one"),
])
def test_bad_flags_are_refused_naming_the_flag(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(MachineValueError) as e:
        machine_from(fields, ("CUDA0", "CUDA1"), detect=Detected.none())
    assert says in str(e.value)


def test_gpu_flags_on_a_command_without_gpus_are_refused() -> None:
    with pytest.raises(MachineValueError, match="--gpu-model: the command uses no GPU"):
        machine_from({"gpu_model": "RTX 4090"}, ("CPU",), detect=Detected.none())
    assert machine_from({"cores": "8"}, ("CPU",), detect=Detected.none()).gpus == ()


def test_a_named_card_silences_the_note_on_the_detected_one() -> None:
    det = Detected(gpus=smi("nvidia-smi-4090d.txt"))
    m = machine_from({"gpu_model": "RTX 4090"}, ("CUDA0",), detect=det)
    assert m.notes == () and m.gpus[0].name == "RTX 4090"


# ---- the CLI -------------------------------------------------------------------------------------

def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_machine_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["machine", "--no-detect", "--gpu-model", "NVIDIA H200", "--cores", "16", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["gpus"][0]["device"] == "CUDA0" and data["gpus"][0]["memory_bandwidth"]["value"] == 4.8e12
    assert data["missing"] == ["host: memory_bandwidth"]
    code, out, _ = _run(["machine", "--no-detect", "--gpus", "CUDA0,CUDA1"], capsys)
    assert code == 0 and "missing: CUDA1: matrix_flops: give --gpu-model" in out
    code, out, _ = _run(["machine", "--cards"], capsys)
    assert code == 0 and out.count("\n") == len(CARDS) + 2


@pytest.mark.parametrize(("argv", "says"), [
    (["--gpu-model", "RTX 9999"], "--gpu-model: 'RTX 9999' is not in moeconf's card table"),
    (["--ram-speed", "DDR9-1x1"], "--ram-speed"),
    (["--host-bandwidth", "90"], "--host-bandwidth: '90' is not a bandwidth"),
    (["--probe-ram", "--host-bandwidth", "90GB/s"], "give one"),
])
def test_machine_command_refusals(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["machine", "--no-detect", *argv], capsys)
    assert code == 2 and says in err and "Traceback" not in err


def test_explain_and_fit_carry_the_machine_only_when_given(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["explain", MANIFEST, "--json", "--", "-ot", "exps=CPU"], capsys)
    assert "machine" not in json.loads(out)
    code, out, _ = _run(["explain", MANIFEST, "--json", "--no-detect", "--gpu-model", "RTX 4090",
                         "--ram-speed", "DDR5-6000x2", "--", "-ot", "exps=CPU"], capsys)
    m = json.loads(out)["machine"]
    assert m["gpus"][0]["name"] == "RTX 4090" and m["host"]["memory_bandwidth"]["value"] == 96e9
    code, _, err = _run(["explain", MANIFEST, "--gpu-model", "RTX 4090 D", "--", "-ot", "exps=CPU"], capsys)
    assert code == 2 and "--gpu-model" in err
    code, out, _ = _run(["fit", MANIFEST, "--gpu", "24GiB", "--json", "--no-detect", "--gpu-model", "RTX 3090"], capsys)
    assert code == 0 and json.loads(out)["machine"]["gpus"][0]["memory_bandwidth"]["value"] == 936e9
    code, out, _ = _run(["fit", MANIFEST, "--gpu", "24GiB", "--json"], capsys)
    assert code == 0 and "machine" not in json.loads(out)


# ---- the plan's [machine] ------------------------------------------------------------------------

_PLAN = """rules = ["experts -> cpu"]
[model]
path = "{model}"
[machine]
{body}
"""


def _plan(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "plan.toml"
    p.write_text(_PLAN.format(model=REPO / MANIFEST, body=body))
    return p


def test_plan_machine_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _plan(tmp_path, 'gpu_model = ["RTX 4090", "RTX 3090"]\npcie = "4x8"\nram_speed = "DDR4-3200x8"\ncores = 32\n'
              'detect = false')
    code, out, _ = _run(["machine", "--plan", str(p), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert [g["name"] for g in data["gpus"]] == ["RTX 4090", "RTX 3090"]
    assert data["gpus"][1]["pcie_link"] == "PCIe 4.0 x8"
    assert data["host"]["memory_bandwidth"]["value"] == 204.8e9 and data["host"]["cores"]["value"] == 32
    assert data["notes"] == []  # detect = false: nothing read
    code, out, _ = _run(["machine", "--plan", str(p), "--json", "--cores", "8"], capsys)
    assert json.loads(out)["host"]["cores"] == {"value": 8, "source": "--cores"}


def test_explain_and_fit_read_a_plans_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--machine-plan FILE gives explain and fit the plan's [machine] (flags over it), asks for the
    speed, and a plan without the table is an error naming the file, not a silent nothing."""
    p = _plan(tmp_path, 'gpu_model = "RTX 3090"\npcie = "4x8"\nram_speed = "DDR4-3200x2"\ncores = 8\ndetect = false')
    code, out, _ = _run(["explain", MANIFEST, "--json", "--machine-plan", str(p), "--cores", "6", "--",
                         "-c", "4096", "-ot", "exps=CPU"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["machine"]["gpus"][0]["name"] == "RTX 3090"
    assert data["machine"]["gpus"][0]["pcie_link"] == "PCIe 4.0 x8"
    assert data["machine"]["host"]["cores"] == {"value": 6, "source": "--cores"}
    assert data["machine"]["host"]["memory_bandwidth"]["source"].startswith("plan [machine] ram_speed DDR4-3200x2")
    assert data["machine"]["notes"] == []  # the plan's detect = false: nothing read
    assert "speed" in data
    code, out, _ = _run(["fit", MANIFEST, "--gpu", "24GiB", "--json", "--machine-plan", str(p)], capsys)
    assert code == 0 and json.loads(out)["machine"]["gpus"][0]["name"] == "RTX 3090"
    bare = tmp_path / "bare.toml"
    bare.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{REPO / MANIFEST}"\n')
    code, _, err = _run(["fit", MANIFEST, "--gpu", "24GiB", "--machine-plan", str(bare)], capsys)
    assert code == 2 and "bare.toml: the plan has no [machine] table" in err, err
    bad = _plan(tmp_path, 'pcie = "fast"')
    code, _, err = _run(["explain", MANIFEST, "--machine-plan", str(bad), "--no-detect", "--", "-c", "4096"], capsys)
    assert code == 2 and ":5:1: machine.pcie: 'fast' is not a PCIe link" in err, err


@pytest.mark.parametrize(("body", "says"), [
    ('ram_speed = "DDR5-6000"', ':5:1: machine.ram_speed: \'DDR5-6000\' is not KIND-SPEEDxCHANNELS'),
    ('pcie = "fast"', ":5:1: machine.pcie: 'fast' is not a PCIe link"),
    ("cores = 0", ":5:1: machine.cores"),
    ('colour = "red"', ":5:1: unknown key 'colour' in [machine] (known: cores, detect,"),
    ('core = 8', ":5:1: unknown key 'core' in [machine] (did you mean 'cores'?)"),
    ('rules = ["experts -> cpu"]', "'rules' is inside [machine]"),
    ('gpu_model = "RTX 4090 D"', "plan.toml:5:1: [machine] gpu_model: 'RTX 4090 D' is not in"),
])
def test_plan_machine_errors_point_at_the_key(body: str, says: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["machine", "--no-detect", "--plan", str(_plan(tmp_path, body))], capsys)
    assert code == 2 and says in err, err


def test_traffic_reads_the_machine_and_no_detect_reads_nothing(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """explain --traffic (the bytes a speed comes from) builds the machine from what the machine
    reports; --no-detect keeps it from reading anything."""
    import moeconf.machine as mm

    seen: list[bool] = []

    def here(want_gpus: bool = True) -> Detected:
        seen.append(want_gpus)
        return Detected(gpus=smi("nvidia-smi-h200.txt"), cores=(16, "/proc/cpuinfo"))

    monkeypatch.setattr(mm.Detected, "here", staticmethod(here))
    code, out, _ = _run(["explain", MANIFEST, "--json", "--traffic", "--", "-c", "4096", "-ot", "exps=CPU"], capsys)
    assert code == 0
    m = json.loads(out)["machine"]
    assert seen == [True]
    assert m["gpus"][0]["name"] == "H200" and m["host"]["cores"] == {"value": 16, "source": "/proc/cpuinfo"}
    code, out, _ = _run(["explain", MANIFEST, "--json", "--traffic", "--no-detect", "--", "-c", "4096",
                         "-ot", "exps=CPU"], capsys)
    assert code == 0 and "machine" not in json.loads(out) and seen == [True]
