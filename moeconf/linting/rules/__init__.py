"""The lint rules, one module each. A module's docstring is its documentation, with FAIL and
PASS examples that the tests run. Codes and names are part of the interface: never reuse them.
Retired: MOE016 nextn-experts-placed (its premise, that ik_llama.cpp loads a nextn block without
MTP, came from an override line ik logs before it skips the tensor)."""

from __future__ import annotations

from types import ModuleType

from moeconf.linting.rules import (
    always_active_to_cpu,
    cache_type_refused,
    comma_in_pattern,
    dense_layer_to_cpu,
    duplicate_rule,
    env_unsupported,
    fit_conflict,
    flag_value_refused,
    invalid_regex,
    item_not_simulated,
    llama_config_placement,
    memory_over_device,
    merge_qkv_mismatch,
    merge_up_gate_split,
    missing_equals,
    model_unknown,
    name_collision,
    ncmoe_semantics,
    ngl_conflict,
    overbroad_catch_all,
    prefix_collision,
    repeated_ot,
    rpc_order,
    rule_overridden,
    rule_selects_nothing,
    shadowed_rule,
    slow_regex,
    sm_graph_overrides,
    space_in_list,
    trailing_comma,
    unescaped_dot,
    unknown_device,
    unknown_flag,
    unmatched_pattern,
    unsupported_regex_syntax,
)

ALL: tuple[ModuleType, ...] = (
    model_unknown, comma_in_pattern, space_in_list, trailing_comma, missing_equals, invalid_regex,
    unsupported_regex_syntax, slow_regex, unknown_device, prefix_collision, unescaped_dot, unmatched_pattern,
    shadowed_rule, duplicate_rule, overbroad_catch_all, always_active_to_cpu, dense_layer_to_cpu,
    ncmoe_semantics, ngl_conflict, fit_conflict, merge_qkv_mismatch,
    merge_up_gate_split, env_unsupported, repeated_ot, rpc_order, rule_selects_nothing, rule_overridden,
    sm_graph_overrides, item_not_simulated, name_collision,
    memory_over_device, cache_type_refused, unknown_flag, flag_value_refused, llama_config_placement,
)
BY_CODE = {m.CODE: m for m in ALL}

# The rules that do not hold for a llama-bench line (engines/benchline.py: it has its own parser),
# each with why; every other rule runs on each of its tests (one per -ot set, -ngl, ... combination).
BENCH_SKIPS: dict[str, str] = {
    "fit-conflict": "llama-bench has no --fit (llama.cpp's -fitt/-fitc fit only when given; ik's --fit is off)",
    "env-unsupported": "llama-bench reads no LLAMA_ARG_* variable",
    "llama-config-placement": "llama-bench reads no llama.cpp config file",
    "comma-in-pattern": "a `,` in llama-bench's -ot starts another set of overrides (another test), not an item",
    "trailing-comma": "a trailing `,` in llama.cpp llama-bench's -ot adds a test without overrides",
    "repeated-ot": "a repeated -ot adds tests (llama.cpp) or items (ik_llama.cpp): none is dropped",
    "rpc-order": "llama-bench registers its RPC servers itself, not in the server's device order",
}
