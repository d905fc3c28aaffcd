"""The speed block of `explain --speed` (moeconf/speed.py): the predicted speeds with their error, the
assumptions, or what is missing or not modelled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moeconf.speed import Prediction

if TYPE_CHECKING:
    from moeconf.machine import Machine


def speed_report(pred: Prediction, machine: Machine | None = None) -> tuple[dict[str, Any], str]:
    """The prediction as explain's and fit's `"speed"` JSON and its text lines: the speeds, the
    machine's figures and the model's constants as `assumed:` lines, or what is missing and the
    flag that gives it (docs/speed.md)."""
    lines = []
    if pred.missing:
        lines.append("speed: not predicted: the machine description lacks " + ", ".join(pred.missing))
        from moeconf.machine import given_by

        lines.extend(f"  {m}: give {given_by(m)}" for m in pred.missing)
        if machine is not None:
            lines.extend(f"  note: {n}" for n in machine.notes)
    elif pred.generation is None:
        lines.append("speed: not predicted: " + "; ".join(pred.refused))
    else:
        head = f"speed (predicted): generation {pred.generation.text()} at depth {pred.depth:,}"
        if pred.prompt is not None:
            head += f"; prompt {pred.prompt.text()} over {pred.prompt_tokens:,} tokens"
        lines.append(head)
        lines.extend(f"  not predicted: {r}" for r in pred.refused)
        lines.extend(f"  assumed: {a}" for a in pred.assumptions)
        if machine is not None:
            lines.extend(f"  note: {n}" for n in machine.notes)
    return pred.json(), "\n".join(lines) + "\n"
