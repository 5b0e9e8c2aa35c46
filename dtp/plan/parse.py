"""Parsing plan dicts: dtp's own form and diffusers' `_tp_plan` (and `_cp_plan`), into `Plan` fields.

A dtp plan dict (a YAML file reads into one) looks like::

    models: [FluxTransformer2DModel]
    attention: ["transformer_blocks.*.attn"]
    tp:
      transformer_blocks.*.attn.to_q: colwise
      transformer_blocks.*.ff.linear_in: {style: packed_colwise, blocks: [1, 1]}
      single_transformer_blocks.*.proj_out: packed_rowwise   # blocks from _tp_packed_row_blocks
      transformer_blocks.*.attn.norm_q: rmsnorm_across_heads   # QK-norm over all heads (Wan, LTX)
      transformer_blocks.*.attn.to_add_out: {style: rowwise, optional: true}   # None in the last block

Rule values: a style name, or a mapping with `style` and optionally `blocks` (packed styles only)
and `optional` (a boolean). The styles:

- `colwise` / `rowwise` / `packed_*` / `colwise_gathered`: nn.Linear splits (see `dtp/styles/`).
- `rmsnorm_across_heads`: an RMSNorm (torch `nn.RMSNorm` or diffusers `RMSNorm`) whose width is a
  colwise q/k projection's full output (all heads), as in Wan, SkyReels-V2, LTX and HiDream. Its
  weight is split like the heads and the engine swaps the module for a distributed RMSNorm
  (`runtime/norms.py`): sum of squares all-reduced over `tp`, divided by the true width. Width
  4 * 16 = 64 at tp = 2: rank r holds weight[32 r : 32 (r + 1)] and computes
  `x_r / sqrt((|x_0|^2 + |x_1|^2) / 64 + eps) * w_r`. Replicating or slicing such a norm runs
  and is silently wrong; a per-head norm (width head_dim) stays replicated and is not planned.
- `shard_output` (with `dim`): a module without parameters whose output tensors are tables over
  the sharded features, cut along `dim` to this rank's contiguous piece by a forward hook: LTX's
  RoPE `rope: {style: shard_output, dim: -1}` (cos/sin over heads x head_dim), Mochi's per-head
  `rope: {style: shard_output, dim: -2}` ([S, heads, head_dim / 2]). Width 64 at tp = 2: rank r
  keeps columns 32 r : 32 (r + 1), the features of its heads.
- `optional: true`: the module exists under some configs only. List elements that lack the member on the key's
  path are skipped (None, as in SD3's and Mochi's context-only last block, or not there, as Mochi's last
  `norm1_context.linear`), and the rule may match nothing (Wan 2.2 Animate without `added_kv_proj_dim`). A module
  that is missing (not None) must be one the model's code creates under some config (`self.<name> = ...` in its
  source, `resolve/binding/globs.py::declared`); a typo is still a PlanError. An `attention:` glob whose `tp` rules
  are all optional is optional too.

Attention modules (`attention:` globs, or inferred) get their head counts and widths rewritten
to per-rank values; kv heads (GQA, e.g. Lumina2's 24 q / 8 kv heads) are counted from the k width
and tp must divide them too (`resolve/heads.py`).

A diffusers `_tp_plan` is the bare `tp` mapping whose values are "colwise" / "rowwise" strings or
`PackedColwiseParallel` / `PackedRowwiseParallel` objects. An optional `cp` section (dtp form or a
diffusers `_cp_plan`) is parsed by `cp.py`.
"""

from __future__ import annotations

from ..errors import PlanError
from ..policy import is_int
from .cp import cp_plan_from_mapping
from .types import Rule, Style

_TOP_LEVEL_KEYS = {"models", "attention", "tp", "cp", "cfg_refused"}
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
            cfg_refused=_reason(data, "cfg_refused", name),
        )
    return dict(rules=_parse_rules(data, name))


def _reason(data: dict, field: str, name: str) -> str | None:
    """A `*_refused: "why"` entry: a non-empty string, or absent."""
    value = data.get(field)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise PlanError(f"plan {name}: `{field}` must say why in a non-empty string, got {value!r}.")
    return value


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
    style, blocks, optional, dim = _parse_value(key, value, name)
    return Rule(key=key, style=style, blocks=blocks, optional=optional, dim=dim)


def _is_whole_atom_wildcard(key: str) -> bool:
    return "*" in key.split(".")


def _parse_value(key: str, value, name: str) -> tuple[Style, tuple[int, ...] | None, bool, int | None]:
    marker = _DIFFUSERS_MARKERS.get(type(value).__name__)
    if marker is not None:
        return marker, _parse_blocks(key, getattr(value, "blocks", None), name), False, None
    if isinstance(value, dict):
        unknown = set(value) - {"style", "blocks", "optional", "dim"}
        if unknown or "style" not in value:
            raise PlanError(
                f"plan {name}: key '{key}': a rule mapping takes `style` and optional `blocks` / `optional` / `dim`, "
                f"got {value!r}."
            )
        style = _parse_style(key, value["style"], name)
        blocks = _parse_blocks(key, value.get("blocks"), name)
        optional = _parse_optional(key, value.get("optional", False), name)
        dim = value.get("dim")
    else:
        style, blocks, optional, dim = _parse_style(key, value, name), None, False, None
    if blocks is not None and not style.is_packed:
        raise PlanError(f"plan {name}: key '{key}': `blocks` only applies to packed styles, not '{style.value}'.")
    if (dim is not None) != ("dim" in style.options) or (dim is not None and not is_int(dim)):
        raise PlanError(
            f"plan {name}: key '{key}': '{Style.SHARD_OUTPUT.value}' needs an integer `dim` (the output dim to cut) "
            f"and no other style takes one; got style '{style.value}', dim {dim!r}."
        )
    return style, blocks, optional, dim


def _parse_optional(key: str, optional, name: str) -> bool:
    if not isinstance(optional, bool):
        raise PlanError(f"plan {name}: key '{key}': `optional` must be true or false, got {optional!r}.")
    return optional


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
