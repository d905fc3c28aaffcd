"""The speed block of `explain --speed` (moeconf/speed.py): the predicted speeds with their error, the
assumptions, or what is missing or not modelled."""

from __future__ import annotations

from typing import Any

from moeconf.speed import Prediction


def speed_report(pred: Prediction) -> tuple[dict[str, Any], str]:
    """The prediction as explain's `"speed"` JSON and its text lines (after the traffic table)."""
    lines = []
    if pred.missing:
        lines.append("speed: not predicted: the machine description lacks " + ", ".join(pred.missing) +
                     " (give them with --speed-machine: docs/speed.md)")
    elif pred.generation is None:
        lines.append("speed: not predicted: " + "; ".join(pred.refused))
    else:
        head = f"speed (predicted): generation {pred.generation.text()} at depth {pred.depth:,}"
        if pred.prompt is not None:
            head += f"; prompt {pred.prompt.text()} over {pred.prompt_tokens:,} tokens"
        lines.append(head)
        lines.extend(f"  not predicted: {r}" for r in pred.refused)
        lines.extend(f"  assumed: {a}" for a in pred.assumptions)
    return pred.json(), "\n".join(lines) + "\n"
