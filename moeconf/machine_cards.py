"""The card table: the GPUs people run MoE models on, each figure with the page it comes from.

Data, not code: one `Card` per row. `memory_bandwidth` is the card's peak in GB/s (10^9 bytes/s);
`matrix_tflops` the dense (no sparsity) FP16 tensor rate in TFLOP/s, FP16 accumulate where the
vendor gives two (GeForce cards halve it with FP32 accumulate), or what `matrix_kind` says;
`pcie` the card's own link (generation, lanes): a slot with fewer lanes is what `nvidia-smi`
reports, and that wins over the table. `names` are what the driver prints (`nvidia-smi
--query-gpu=name`, `rocm-smi --showproductname`) and what a user types, compared after
`card_key` (case, `NVIDIA`/`GeForce`/`Tesla`/`AMD`/`Radeon` and punctuation dropped), exactly:
a name no row lists matches no row. `first_hand` is True where every figure is on the vendor's
page, datasheet or whitepaper named in `source`; otherwise `note` says which figure is derived or
second-hand and how. `checked` names a stored public page found to state the same figures
(None: not cross-checked). `docs/speed.md` ("The machine") shows this table, and a test checks
that it does.
"""

from __future__ import annotations

from dataclasses import dataclass

# vendor pages (the sources the rows cite)
_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_BLACKWELL = "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/nvidia-rtx-blackwell-gpu-architecture.pdf"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
# a derived matrix rate: tensor cores x FLOP per core per clock (the architecture whitepaper's rate:
# 256 for dense FP16 with FP16 accumulate on Ampere GA10x, Ada and Blackwell GeForce) x boost clock
_TURING = ("https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/"
           "NVIDIA-Turing-Architecture-Whitepaper.pdf")
# Turing's tensor cores do half that: 64 FP16 FMA (128 FLOP) per clock with FP16 accumulate (the Turing whitepaper)
_DERIVED_TURING = ("matrix rate derived: {tc} tensor cores x 128 FLOP/clock x {ghz} GHz reference boost (the vendor's "
                   "core count and clock; Founders Edition cards boost higher)")
_DERIVED = ("matrix rate derived: {tc} tensor cores x 256 FLOP/clock x {ghz} GHz boost (the vendor's core count and "
            "clock)")


@dataclass(frozen=True)
class Card:
    key: str  # the row's name, as tables and messages show it
    names: tuple[str, ...]  # names the driver prints and users type (compared by card_key)
    vendor: str
    family: str  # architecture
    compute: str  # CUDA compute capability, or the AMD gfx target
    memory_gb: float  # nominal memory (GB as the vendor counts), to tell same-named cards apart
    memory_bandwidth: float  # GB/s, peak
    pcie_gen: int
    pcie_lanes: int
    matrix_tflops: float  # dense, see matrix_kind
    matrix_kind: str
    source: str
    first_hand: bool
    note: str = ""
    checked: str | None = None


_FP16 = "FP16 tensor, dense, FP16 accumulate"
_FP16_ANY = "FP16 tensor, dense"

CARDS: tuple[Card, ...] = (
    Card("RTX 2080", ("GeForce RTX 2080", "RTX 2080"), "NVIDIA", "Turing", "7.5", 8, 448, 3, 16, 80.5, _FP16, _TURING,
         False, _DERIVED_TURING.format(tc=368, ghz=1.71),
         checked="https://www.tomshardware.com/reviews/nvidia-turing-gpu-architecture-explored,5801-5.html"),
    Card("RTX 2080 SUPER", ("GeForce RTX 2080 SUPER", "RTX 2080 SUPER"), "NVIDIA", "Turing", "7.5", 8, 496, 3, 16,
         89.2, _FP16, "https://www.nvidia.com/en-us/geforce/graphics-cards/compare/?section=compare-20", False,
         _DERIVED_TURING.format(tc=384, ghz=1.815) + "; bandwidth: 15.5 Gbps x 256 bits"),
    Card("RTX 2080 Ti", ("GeForce RTX 2080 Ti", "RTX 2080 Ti"), "NVIDIA", "Turing", "7.5", 11, 616, 3, 16, 107.6, _FP16,
         _TURING, False, _DERIVED_TURING.format(tc=544, ghz=1.545) + " (the whitepaper's 114 TFLOPS is the Founders "
         "Edition's 1.635 GHz)",
         checked="https://www.tomshardware.com/reviews/nvidia-turing-gpu-architecture-explored,5801-5.html"),
    Card("RTX 3060 12GB", ("GeForce RTX 3060", "RTX 3060", "RTX 3060 12GB"), "NVIDIA", "Ampere", "8.6", 12, 360, 4, 16,
         51.0, _FP16, "https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3060-3060ti/", False,
         _DERIVED.format(tc=112, ghz=1.777) + "; the 8 GB RTX 3060 (240 GB/s) is another card: not this row",
         checked="https://cpu-gpu.alldbin.com/graphics-card-comparison/GeForce-RTX-3090-Ti-and-GeForce-RTX-3060-12-GB-GA104-comparison.html"),
    Card("RTX 3080 10GB", ("GeForce RTX 3080", "RTX 3080", "RTX 3080 10GB"), "NVIDIA", "Ampere", "8.6", 10, 760, 4, 16,
         119.0, _FP16, _GA102, True,
         checked="https://www.itcreations.com/nvidia-gpu/nvidia-geforce-rtx-3080-gpu"),
    Card("RTX 3080 12GB", ("GeForce RTX 3080", "RTX 3080", "RTX 3080 12GB"), "NVIDIA", "Ampere", "8.6", 12, 912, 4, 16,
         122.6, _FP16, "https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3080-3080ti/", False,
         _DERIVED.format(tc=280, ghz=1.71)),
    Card("RTX 3090", ("GeForce RTX 3090", "RTX 3090"), "NVIDIA", "Ampere", "8.6", 24, 936, 4, 16,
         142.0, _FP16, _GA102, True,
         checked="https://holynerdvana.blogspot.com/2022/10/nvidia-geforce-rtx-3090-specifications.html"),
    Card("RTX 3090 Ti", ("GeForce RTX 3090 Ti", "RTX 3090 Ti"), "NVIDIA", "Ampere", "8.6", 24, 1008, 4, 16,
         160.0, _FP16, "https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3090-3090ti/", False,
         _DERIVED.format(tc=336, ghz=1.86),
         checked="https://www.tweaktown.com/news/84164/nvidia-geforce-rtx-3090-ti-full-specs-price-performance-details/index.html"),
    Card("RTX 4060 Ti 16GB", ("GeForce RTX 4060 Ti", "RTX 4060 Ti", "RTX 4060 Ti 16GB"), "NVIDIA",
         "Ada Lovelace", "8.9", 16, 288, 4, 8, 88.3, _FP16,
         "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4060-4060ti/", False,
         _DERIVED.format(tc=136, ghz=2.535) + "; the card has 8 PCIe lanes",
         checked="https://www.guru3d.com/story/geforce-rtx-4060-ti-gpu-pictured/"),
    Card("RTX 4070 Ti SUPER", ("GeForce RTX 4070 Ti SUPER", "RTX 4070 Ti SUPER"), "NVIDIA", "Ada Lovelace", "8.9",
         16, 672, 4, 16, 176.4, _FP16,
         "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4070-family/", False,
         _DERIVED.format(tc=264, ghz=2.61),
         checked="https://www.svethardware.cz/nvidia-geforce-rtx-4000-super-prichazi-vice-jader-vice-pameti-nebo-nizsi-cena/60300"),
    Card("RTX 4080", ("GeForce RTX 4080", "RTX 4080"), "NVIDIA", "Ada Lovelace", "8.9", 16, 716.8, 4, 16,
         194.9, _FP16, _ADA, True,
         checked="https://www.holynerdvana.com/2022/10/nvidia-geforce-rtx-4080-specifications.html"),
    Card("RTX 4080 SUPER", ("GeForce RTX 4080 SUPER", "RTX 4080 SUPER"), "NVIDIA", "Ada Lovelace", "8.9", 16, 736, 4,
         16, 208.9, _FP16, "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4080-family/", False,
         _DERIVED.format(tc=320, ghz=2.55),
         checked="https://www.svethardware.cz/nvidia-geforce-rtx-4000-super-prichazi-vice-jader-vice-pameti-nebo-nizsi-cena/60300"),
    Card("RTX 4090", ("GeForce RTX 4090", "RTX 4090"), "NVIDIA", "Ada Lovelace", "8.9", 24, 1008, 4, 16,
         330.3, _FP16, _ADA, True,
         checked="https://www.sipoch.com/en/article/300330018665596"),
    Card("RTX 5060 Ti 16GB", ("GeForce RTX 5060 Ti", "RTX 5060 Ti", "RTX 5060 Ti 16GB"), "NVIDIA", "Blackwell", "12.0",
         16, 448, 5, 8, 94.8, _FP16,
         "https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5060-family/", False,
         _DERIVED.format(tc=144, ghz=2.572) + "; the card has 8 PCIe lanes",
         checked="https://worldnl.com/nvidia-rtx-5060-ti-final-specs-and-launch-day-allegedly-leaked-182199.html"),
    Card("RTX 5070 Ti", ("GeForce RTX 5070 Ti", "RTX 5070 Ti"), "NVIDIA", "Blackwell", "12.0", 16, 896, 5, 16,
         175.8, _FP16, "https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5070-family/", False,
         _DERIVED.format(tc=280, ghz=2.452),
         checked="https://intopress.info/recherche/p/i/?a=normal&get=f_125&rid=67fc9c36be54b"),
    Card("RTX 5080", ("GeForce RTX 5080", "RTX 5080"), "NVIDIA", "Blackwell", "12.0", 16, 960, 5, 16,
         225.1, _FP16, "https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5080/", False,
         _DERIVED.format(tc=336, ghz=2.617),
         checked="https://www.brojogopalsapui.com/ai-foundations/sub_contents/AI_hardware/rtx5080_deep_dive_opus_light.html"),
    Card("RTX 5090", ("GeForce RTX 5090", "RTX 5090"), "NVIDIA", "Blackwell", "12.0", 32, 1792, 5, 16,
         419.0, _FP16, _BLACKWELL, True,
         checked="https://pocketmags.com/linux-format-magazine/may-2025/articles/nvidia-geforce-rtx-5090"),
    Card("RTX A4000", ("RTX A4000",), "NVIDIA", "Ampere", "8.6", 16, 448, 4, 16, 76.7, _FP16_ANY,
         "https://www.nvidia.com/content/dam/en-zz/Solutions/gtcs21/rtx-a4000/nvidia-rtx-a4000-datasheet.pdf", True,
         "half the datasheet's 153.4 TFLOPS tensor figure, which is with sparsity",
         checked="https://www.ecer.com/corp/details-uuuedqa-p1bsb03-pci-express-3-0-x16-nvidia-rtx-a4000-16g-graphics-card-for-professional-video-editing.html"),
    Card("RTX A5000", ("RTX A5000",), "NVIDIA", "Ampere", "8.6", 24, 768, 4, 16, 111.1, _FP16_ANY,
         "https://www.nvidia.com/content/dam/en-zz/Solutions/gtcs21/rtx-a5000/nvidia-rtx-a5000-datasheet.pdf", True,
         "half the datasheet's 222.2 TFLOPS tensor figure, which is with sparsity"),
    Card("RTX A6000", ("RTX A6000",), "NVIDIA", "Ampere", "8.6", 48, 768, 4, 16, 154.8, _FP16_ANY, _GA102, True,
         "the whitepaper's appendix C (RTX A6000)",
         checked="https://sysrqmts.com/tr/gpus/compare/nvidia-a16-pcie-vs-nvidia-rtx-a6000"),
    Card("RTX 6000 Ada", ("RTX 6000 Ada Generation", "RTX 6000 Ada"), "NVIDIA", "Ada Lovelace", "8.9", 48, 960, 4, 16,
         364.2, _FP16_ANY, _ADA, True, "the whitepaper's RTX 6000 Ada table",
         checked="https://cputronic.com/de/gpu/nvidia-rtx-6000-ada-generation"),
    Card("RTX PRO 6000 Blackwell", ("RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell",
                                    "RTX PRO 6000"), "NVIDIA", "Blackwell", "12.0", 96, 1792, 5, 16,
         503.8, _FP16_ANY,
         "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/rtx-pro-6000/", False,
         _DERIVED.format(tc=752, ghz=2.617) + " (the datasheet gives 4,000 AI TOPS, FP4 with sparsity: 500 "
         "dense FP16); the Max-Q and Server editions run lower clocks: not this row",
         checked="https://www.topcpu.net/es/news/nvidia-launches-96gb-rtx-5090-model-with-a-whopping-price-tag-of-10000"),
    Card("L4", ("L4",), "NVIDIA", "Ada Lovelace", "8.9", 24, 300, 4, 16, 121.0, _FP16_ANY,
         "https://www.nvidia.com/en-us/data-center/l4/", True,
         "half the datasheet's 242 TFLOPS, which is with sparsity",
         checked="https://store.sourcecode.com/en-us/bg-bucket-compare/125/9820"),
    Card("L40S", ("L40S",), "NVIDIA", "Ada Lovelace", "8.9", 48, 864, 4, 16, 362.05, _FP16_ANY,
         "https://www.nvidia.com/en-us/data-center/l40s/", True,
         checked="https://www.mullet.se/product.html?product_id=355414"),
    Card("A100 40GB PCIe", ("A100-PCIE-40GB", "A100 PCIe 40GB", "A100 40GB PCIe"), "NVIDIA", "Ampere", "8.0", 40, 1555,
         4, 16, 312.0, _FP16_ANY, _A100, True,
         checked="https://www.thundercompute.com/blog/nvidia-a100-specs-full-guide"),
    Card("A100 80GB PCIe", ("A100 80GB PCIe", "A100-PCIE-80GB", "A100 PCIe 80GB"), "NVIDIA", "Ampere", "8.0", 80, 1935,
         4, 16, 312.0, _FP16_ANY, _A100, True,
         checked="https://www.thundercompute.com/blog/nvidia-a100-specs-full-guide"),
    Card("A100 40GB SXM", ("A100-SXM4-40GB", "A100 SXM4 40GB", "A100 40GB SXM"), "NVIDIA", "Ampere", "8.0", 40, 1555,
         4, 16, 312.0, _FP16_ANY, _A100, True, checked="https://glennklockwood.com/garden/processors/A100"),
    Card("A100 80GB SXM", ("A100-SXM4-80GB", "A100 SXM4 80GB", "A100 80GB SXM"), "NVIDIA", "Ampere", "8.0", 80, 2039,
         4, 16, 312.0, _FP16_ANY, _A100, True, checked="https://glennklockwood.com/garden/processors/A100"),
    Card("H100 PCIe", ("H100 PCIe",), "NVIDIA", "Hopper", "9.0", 80, 2000, 5, 16, 756.5, _FP16_ANY, _H100, True,
         "half the datasheet's 1,513 TFLOPS, which is with sparsity",
         checked="https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html"),
    Card("H100 SXM", ("H100 80GB HBM3", "H100 SXM", "H100 SXM5 80GB"), "NVIDIA", "Hopper", "9.0", 80, 3350, 5, 16,
         989.5, _FP16_ANY, _H100, True, "half the datasheet's 1,979 TFLOPS, which is with sparsity",
         checked="https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html"),
    Card("H100 NVL", ("H100 NVL",), "NVIDIA", "Hopper", "9.0", 94, 3900, 5, 16, 835.5, _FP16_ANY, _H100, True,
         "half the datasheet's 1,671 TFLOPS, which is with sparsity"),
    Card("H200", ("H200", "H200 SXM", "H200 141GB HBM3e"), "NVIDIA", "Hopper", "9.0", 141, 4800, 5, 16, 989.5,
         _FP16_ANY, _H200, True, "half the datasheet's 1,979 TFLOPS, which is with sparsity",
         checked="https://www.morphllm.com/nvidia-h200"),
    Card("H200 NVL", ("H200 NVL",), "NVIDIA", "Hopper", "9.0", 141, 4800, 5, 16, 835.5, _FP16_ANY, _H200, True,
         "half the datasheet's 1,671 TFLOPS, which is with sparsity", checked="https://www.morphllm.com/nvidia-h200"),
    Card("V100 SXM2 16GB", ("V100-SXM2-16GB", "V100 SXM2 16GB"), "NVIDIA", "Volta", "7.0", 16, 900, 3, 16, 125.0,
         _FP16_ANY, _V100, True),
    Card("V100 SXM2 32GB", ("V100-SXM2-32GB", "V100 SXM2 32GB"), "NVIDIA", "Volta", "7.0", 32, 900, 3, 16, 125.0,
         _FP16_ANY, _V100, True),
    Card("V100 PCIe 16GB", ("V100-PCIE-16GB", "V100 PCIe 16GB"), "NVIDIA", "Volta", "7.0", 16, 900, 3, 16, 112.0,
         _FP16_ANY, _V100, True),
    Card("V100 PCIe 32GB", ("V100-PCIE-32GB", "V100 PCIe 32GB"), "NVIDIA", "Volta", "7.0", 32, 900, 3, 16, 112.0,
         _FP16_ANY, _V100, True),
    Card("P40", ("P40",), "NVIDIA", "Pascal", "6.1", 24, 346, 3, 16, 12.0, "FP32, no tensor cores",
         "https://images.nvidia.com/content/pdf/tesla/184427-Tesla-P40-Datasheet-NV-Final-Letter-Web.pdf", True,
         "no tensor cores and FP16 at 1/64 rate: the datasheet's FP32 rate, which ggml's kernels use on this card",
         checked="https://omegaco.ae/shop/gpu-cards-edge-ai/nvidia-p40"),
    Card("RX 7900 XTX", ("RX 7900 XTX", "7900 XTX"), "AMD", "RDNA 3", "gfx1100", 24, 960, 4, 16, 122.8,
         "FP16, dense (WMMA)",
         "https://www.amd.com/en/products/graphics/desktops/radeon/7000-series/amd-radeon-rx-7900xtx.html", True,
         "AMD's peak FP16 figure; the bandwidth and link cross-checked, the FP16 figure not",
         checked="https://pcspecchart.com/pc_parts/gpu/5"),
    Card("MI100", ("Instinct MI100", "MI100"), "AMD", "CDNA", "gfx908", 32, 1228.8, 4, 16, 184.6, "FP16 matrix, dense",
         "https://www.amd.com/en/products/accelerators/instinct/mi100.html", True,
         checked="https://www.anandtech.com/show/17326/amd-releases-instinct-mi210-accelerator-cdna-2-on-a-pcie-card"),
    Card("MI210", ("Instinct MI210", "MI210"), "AMD", "CDNA 2", "gfx90a", 64, 1638.4, 4, 16, 181.0,
         "FP16 matrix, dense",
         "https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html", True,
         checked="https://www.anandtech.com/show/17326/amd-releases-instinct-mi210-accelerator-cdna-2-on-a-pcie-card"),
)

_DROP = frozenset({"nvidia", "geforce", "tesla", "amd", "radeon", "ati"})


def card_key(name: str) -> str:
    """A card name as the table compares it: lower case, `-`, `_` and runs of spaces as one space,
    the vendor and brand words left out. `NVIDIA GeForce RTX 4090` -> `rtx 4090`."""
    words = name.replace("-", " ").replace("_", " ").casefold().split()
    return " ".join(w for w in words if w not in _DROP)


_BY_KEY: dict[str, tuple[Card, ...]] = {}
for _c in CARDS:
    for _n in {card_key(n) for n in (*_c.names, _c.key)}:
        _BY_KEY[_n] = (*_BY_KEY.get(_n, ()), _c)


def _same_memory(card: Card, memory_mib: float) -> bool:
    """A card whose reported memory is the row's nominal size: drivers report it in MiB, a little
    under or over the vendor's GB (an H200's 141 GB reads 143,771 MiB, a 24 GB card 24,564 MiB)."""
    return abs(memory_mib / 1024 - card.memory_gb) <= 0.07 * card.memory_gb


class CardUnknown(ValueError):
    """A name the table has no row for, or whose rows its memory does not fit; the message says so."""


def find_card(name: str, memory_mib: float | None = None) -> Card:
    """The row for a card name (as the driver prints it or a user types it); with `memory_mib` (the
    driver's memory.total) the row whose memory it is. Raises CardUnknown when no row names it
    (no partial match: `RTX 4090 D` is not an `RTX 4090`), when its memory fits no row of that
    name, or when the name fits several rows and nothing tells them apart."""
    rows = _BY_KEY.get(card_key(name), ())
    if not rows:
        raise CardUnknown(f"{name!r} is not in moeconf's card table (`moeconf machine --cards` lists it)")
    if memory_mib is not None:
        fit = tuple(c for c in rows if _same_memory(c, memory_mib))
        if not fit:
            raise CardUnknown(f"{name!r} with {memory_mib / 1024:.0f} GiB is not a card of the table (its rows of that "
                              f"name: {', '.join(f'{c.key} ({c.memory_gb:g} GB)' for c in rows)})")
        rows = fit
    if len(rows) > 1:
        raise CardUnknown(f"{name!r} names {len(rows)} cards: {' or '.join(c.key for c in rows)}; give one of these")
    return rows[0]
