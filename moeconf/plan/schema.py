"""The plan JSON Schema, generated from the pydantic models (`schemas/plan.schema.json`)."""

from __future__ import annotations

from typing import Any


def plan_schema() -> dict[str, Any]:
    from moeconf.plan.model import PlanModel

    schema = PlanModel.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/moeconf/moeconf/schemas/plan.schema.json",
        **schema,
    }
