"""Parsing plan dicts: dtp's own form and diffusers' `_tp_plan` (and `_cp_plan`), into `Plan` fields.

A dtp plan dict (a YAML file reads into one) looks like::

    models: [FluxTransformer2DModel]
    attention: ["transformer_blocks.*.attn"]
    tp:
      transformer_blocks.*.attn.to_q: colwise
      transformer_blocks.*.ff.linear_in: {style: packed_colwise, blocks: [1, 1]}
      single_transformer_blocks.*.proj_out: packed_rowwise   # blocks from _tp_packed_row_blocks

A diffusers `_tp_plan` is the bare `tp` mapping whose values are "colwise" / "rowwise" strings or
`PackedColwiseParallel` / `PackedRowwiseParallel` objects. An optional `cp` section (dtp form or a
diffusers `_cp_plan`) is parsed by `cp.py`.
"""

from __future__ import annotations

from ..errors import PlanError
from ..policy import is_int
from .cp import cp_plan_from_mapping
from .types import Rule, Style

_TOP_LEVEL_KEYS = {"models", "attention", "tp", "cp"}
# diffusers marker classes, matched by name so that reading a plan does not import diffusers hooks.
_DIFFUSERS_MARKERS = {
    "PackedColwiseParallel": Style.PACKED_COLWISE,
    "PackedRowwiseParallel": Style.PACKED_ROWWISE,
}


def plan_fields(data: dict, name: str) -> dict:
    """`Plan` fields from a dtp plan dict (has a `tp` mapping) or a flat diffusers `_tp_plan`."""
    if not isinstance(data, dict):
        raise PlanError(f"plan {name}: expected a mapping, got {type(data).__name__}.")
    if "tp" in data and isinstance(data["tp"], dict):
        unknown = set(data) - _TOP_LEVEL_KEYS
        if unknown:
            raise PlanError(
                f"plan {name}: unknown top-level keys {sorted(unknown)}; allowed: {sorted(_TOP_LEVEL_KEYS)}."
            )
        return dict(
            rules=_parse_rules(data["tp"], name),
            models=tuple(_string_list(data, "models", name) or ()),
            attention=_string_list(data, "attention", name),
            cp=cp_plan_from_mapping(data["cp"], name) if data.get("cp") is not None else None,
        )
    return dict(rules=_parse_rules(data, name))


def _string_list(data: dict, field: str, name: str) -> tuple[str, ...] | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PlanError(f"plan {name}: `{field}` must be a list of strings, got {value!r}.")
    return tuple(value)


def _parse_rules(mapping: dict, name: str) -> tuple[Rule, ...]:
    if not mapping:
        raise PlanError(f"plan {name}: the `tp` mapping is empty; a plan needs at least one rule.")
    return tuple(_parse_rule(key, value, name) for key, value in mapping.items())


def _parse_rule(key, value, name: str) -> Rule:
    if not isinstance(key, str) or not key:
        raise PlanError(f"plan {name}: key {key!r} must be a non-empty module path string.")
    if key.count("*") > 1:
        raise PlanError(
            f"plan {name}: key '{key}' has {key.count('*')} wildcards; at most one `*` is allowed "
            f"(it stands for the elements of one nn.ModuleList). List nested lists by index."
        )
    if "*" in key and not _is_whole_atom_wildcard(key):
        raise PlanError(f"plan {name}: key '{key}': `*` must be a whole path atom, e.g. 'blocks.*.attn.to_q'.")
    style, blocks = _parse_value(key, value, name)
    return Rule(key=key, style=style, blocks=blocks)


def _is_whole_atom_wildcard(key: str) -> bool:
    return "*" in key.split(".")


def _parse_value(key: str, value, name: str) -> tuple[Style, tuple[int, ...] | None]:
    marker = _DIFFUSERS_MARKERS.get(type(value).__name__)
    if marker is not None:
        return marker, _parse_blocks(key, getattr(value, "blocks", None), name)
    if isinstance(value, dict):
        unknown = set(value) - {"style", "blocks"}
        if unknown or "style" not in value:
            raise PlanError(
                f"plan {name}: key '{key}': a rule mapping takes `style` and optional `blocks`, got {value!r}."
            )
        style = _parse_style(key, value["style"], name)
        blocks = _parse_blocks(key, value.get("blocks"), name)
    else:
        style, blocks = _parse_style(key, value, name), None
    if blocks is not None and not style.is_packed:
        raise PlanError(f"plan {name}: key '{key}': `blocks` only applies to packed styles, not '{style.value}'.")
    return style, blocks


def _parse_style(key: str, value, name: str) -> Style:
    try:
        return Style(value)
    except ValueError:
        allowed = ", ".join(s.value for s in Style)
        raise PlanError(f"plan {name}: key '{key}': unknown style {value!r}; allowed: {allowed}.") from None


def _parse_blocks(key: str, blocks, name: str) -> tuple[int, ...] | None:
    if blocks is None:
        return None
    ok = isinstance(blocks, (list, tuple)) and blocks and all(is_int(b) and b > 0 for b in blocks)
    if not ok:
        raise PlanError(
            f"plan {name}: key '{key}': blocks must be a non-empty list of positive integers, got {blocks!r}."
        )
    return tuple(blocks)
