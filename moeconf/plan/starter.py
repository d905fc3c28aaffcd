"""`moeconf init`: a commented starter plan for a model. Values are written with `tomli-w`
(so quoting is always right); the comments around them are moeconf's."""

from __future__ import annotations

import os
from typing import Any

import tomli_w

from moeconf.model.inventory import Inventory, first_shard, format_ranges
from moeconf.model.taxonomy import GROUPS
from moeconf.textsafe import safe
from moeconf.units import gib


def _value(v: Any) -> str:
    return tomli_w.dumps({"v": v}).split("=", 1)[1].strip()


def _table(name: str, data: dict[str, Any]) -> str:
    return f"[{name}]\n" + tomli_w.dumps(data)


def _version_hint(engine: str) -> str:
    """A comment on [engine] version, from the engine facts (what changes with the version)."""
    from moeconf.engines import IK_NEWEST_DATE, IK_PACKAGES, NEWEST_MAINLINE_BUILD

    if engine == "ik_llama.cpp":
        return (f"# version: the ik_llama.cpp you run, a package version ({', '.join(IK_PACKAGES)}) or its commit "
                f"date YYYY-MM-DD;\n#   unset means the newest moeconf knows ({IK_NEWEST_DATE}). It decides the "
                "-ngl default and what --n-cpu-moe takes.")
    return (f"# version: the llama.cpp build you run (b7600); unset means the newest moeconf knows "
            f"(b{NEWEST_MAINLINE_BUILD}).")


def starter_plan(inv: Inventory, model_arg: str, out_dir: str, engine: str = "llama.cpp",
                 *, remote: bool = False) -> str:
    """`remote`: model_arg is a remote MODEL string (moeconf.hub), kept as written; compile turns it
    into the engine's -hf / -mu."""
    md = inv.metadata
    # a later shard of a split model: the plan names the first, which the engines load
    model_abs = os.path.abspath(model_arg if inv.from_manifest else first_shard(model_arg))
    rel = model_arg if remote else os.path.relpath(model_abs, out_dir)
    bytes_of = {g: inv.total_bytes(t for t in inv.tensors if t.group == g) for g in GROUPS}
    moe = inv.layers_of_kind("moe")
    dense = inv.layers_of_kind("dense")
    nextn = inv.layers_of_kind("nextn")
    always = sum(bytes_of[g] for g in ("attn", "shexp", "router", "norm", "dense", "output"))
    # strings from the GGUF go into comments: escaped, so a newline cannot add lines to the plan
    title = safe(md.name or os.path.basename(model_arg))
    facts = safe(f"{md.arch}, {md.file_type_name or 'unknown type'}")
    out = [
        f"# moeconf plan for {title} ({facts}), {inv.block_count} blocks:",
        f"#   dense {format_ranges(dense)}, moe {format_ranges(moe)}, nextn {format_ranges(nextn)}",
        f"#   routed experts {gib(bytes_of['experts'])} GiB; always-active tensors "
        f"(attention, shared experts, router, norms, dense layers, output) {gib(always)} GiB",
        "#",
        "# Rules are `SELECTOR -> DEVICE`, applied in order: later rules refine earlier ones.",
        "# Groups: " + ", ".join(GROUPS) + ". Devices: cpu, gpu (= gpu0), gpu1, ... or CUDA1, RPC0[host:port].",
        "# Compile with: moeconf compile THIS_FILE   (--target docker / compose / llama-swap / env / json)",
        "rules = [",
        f"  {_value('experts -> cpu')},  # routed experts in system RAM; everything else stays on the GPU",
        "  # " + _value("experts first 4 -> gpu") + ",  # then win back VRAM-sized slices of experts",
        "  # " + _value("experts layers 10..12 -> gpu1") + ",  # or spread them over a second GPU",
    ]
    if nextn:
        out.append(f"  # nextn blocks ({format_ranges(nextn)}) are MTP layers, loaded only when MTP is on")
    out.append("]")
    out.append("")
    model: dict[str, Any] = {"path": rel}
    if inv.from_manifest and not remote:
        model["serve_path"] = f"/models/{(md.name or 'model').replace(' ', '-')}.gguf"
        out.append("# serve_path: the GGUF path as the server sees it (a manifest has no weights). Adjust it.")
    out.append(_table("model", model))
    out.append(_version_hint(engine))
    out.append(_table("engine", {"name": engine, "gpus": ["CUDA0"]}))
    out.append("# Placement-relevant flags; docs/plans.md lists all of them.")
    out.append(_table("flags", {"ctx_size": 32768}))
    return "\n".join(out)
