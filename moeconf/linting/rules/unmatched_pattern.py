r"""unmatched-pattern: an -ot item that matches no tensor the engine loads.

Why: neither engine reports patterns that match nothing: the tensors simply stay where `-ngl`
put them, and VRAM runs out (or RAM sits idle) with no hint why. Common causes: a typo, a guide
whose `.*` a web page ate (`ffn._exps`), a space after a comma, a layer beyond the model, or a
nextn block the engine does not load.

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "ffn._exps=CPU"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "ffn_.*_exps=CPU"
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, where_item

CODE = "MOE010"
NAME = "unmatched-pattern"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None and ctx.inventory is not None
    for k, it in enumerate(ctx.explanation.items):
        if it.touches or it.raw_index is None:
            continue
        if it.pattern != it.pattern.strip():
            continue  # space-in-list says it better
        rx = re.compile(it.pattern)
        unloaded = [t.name for t in ctx.inventory.tensors
                    if ctx.explanation.placement.devices[t.name] is None and rx.search(t.name)]
        if unloaded:
            why = f"it matches only tensors {ctx.engine.name} does not load ({len(unloaded)}, e.g. {unloaded[0]})"
        elif ("._" in it.pattern or "_." in it.pattern) and ".*" not in it.pattern:
            why = "a '.*' may have been lost (write 'ffn_.*_exps')"
        else:
            why = "see the names with `moeconf inspect MODEL --tensors`"
        model = ctx.inventory.metadata.name or "the model"
        yield Hit(*where_item(ctx, k), f"{it.pattern!r} matches no tensor of {model}: {why}")
