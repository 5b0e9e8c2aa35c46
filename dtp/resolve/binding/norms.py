"""Planned RMSNorms across heads (`rmsnorm_across_heads`): which modules, their widths and layouts.

Wan, SkyReels-V2, LTX and HiDream normalize q and k over the full inner width (all heads) before
splitting heads. After a colwise q/k projection each rank holds `D / tp` of those features, so the
norm must see the sum of squares of all ranks: the weight is split like the heads
(`Layout(0, (D,))`, contiguous per rank) and the runtime (`runtime/norms.py`) all-reduces the
per-rank sums and divides by the true width `D`. Example: Wan 14B `attn1.norm_q` has D = 40 * 128 =
5120; at tp = 8 each rank holds weight[640 r : 640 (r + 1)] and normalizes by sum_r |x_r|^2 / 5120.

Checked here, before anything mutates: the target is an RMSNorm with one normalized dim; its width
equals the width of a colwise Linear in the same parent module (the projection it normalizes), so
a norm over something that is not sharded is refused; tp must divide the width. And the other way
round: a norm module directly under a sharded attention module whose width is a colwise sibling's
full output width (a QK-norm across heads) but that the plan does not name is refused, because
left replicated it would meet a `D / tp` wide input (a shape error at best; a norm that slices its
weight to fit would be silently wrong). Per-head norms (width head_dim) are not affected, nor are norms of other
classes (LayerNorm): the style cannot plan them, and when the width also equals the attention's input width they
are often pre-norms of that input (Wan Animate's face adapter: `pre_norm_q` over dim = heads x head_dim); a
LayerNorm that did meet a sharded input raises in `F.layer_norm`'s shape check (the flow check, at prepare).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ...errors import PlanError
from ...plan import Plan, Rule
from ..layout import Layout
from .constraints import Constraint
from .globs import expand
from .linears import LinearSpec

NORM_CLASS_NAMES = ("RMSNorm",)  # torch.nn.RMSNorm and diffusers.models.normalization.RMSNorm


@dataclass(frozen=True)
class NormSpec:
    """One planned RMSNorm: its path, rule, normalized width, epsilon and which parameters it has."""

    path: str
    rule: Rule
    width: int  # the true (global) number of normalized features, D
    eps: float | None  # None: torch's default (finfo(dtype).eps), as nn.RMSNorm does
    param_names: tuple[str, ...]  # "weight" and/or "bias", each of shape [D]
    padded_width: int | None = None  # pad=True: D' >= D, zero features like the q/k projection's padded rows

    def param_layouts(self) -> dict[str, Layout]:
        """Every parameter is split along its only dim, contiguously per rank, like the heads (zero-padded
        to `padded_width` like them under pad=True: zero weight on zero features, the mean still over D)."""
        padded = (self.padded_width,) if self.padded_width is not None else None
        return {name: Layout(0, (self.width,), padded) for name in self.param_names}

    def constraints(self) -> list[Constraint]:
        width = self.padded_width if self.padded_width is not None else self.width
        return [Constraint(width, f"normalized width of {self.path}", self.rule.key)]


def resolve_norms(
    plan: Plan, model: nn.Module, linears: list[LinearSpec], attention_paths: list[str] = ()
) -> list[NormSpec]:
    """One NormSpec per module an `rmsnorm_across_heads` rule addresses; PlanError for wrong targets
    and for unplanned norms across the heads of a sharded attention module in `attention_paths`."""
    colwise = [s for s in linears if s.style.shard_dim == 0 and not s.style.gathers_output]
    specs = []
    for rule in (r for r in plan.rules if r.style.is_norm):
        for path, module in expand(model, rule.key, plan.name, optional=rule.optional):
            spec = _norm_spec(plan, rule, path, module)
            _check_follows_colwise(plan, spec, colwise)
            specs.append(spec)
    _check_no_unplanned_norm(plan, model, colwise, attention_paths, {spec.path for spec in specs})
    return specs


def _check_no_unplanned_norm(plan: Plan, model: nn.Module, colwise, attention_paths, planned: set[str]) -> None:
    for parent in attention_paths:
        widths = {sum(s.sizes) for s in colwise if s.path.rpartition(".")[0] == parent}
        for name, child in model.get_submodule(parent).named_children():
            width = _normalized_width(child)
            path = f"{parent}.{name}"
            plannable = type(child).__name__ in NORM_CLASS_NAMES
            if plannable and width in widths and path not in planned:
                raise PlanError(
                    f"plan {plan.name}: '{path}' ({type(child).__name__}) normalizes {width} features, the full width "
                    f"of a colwise projection in '{parent}' (a QK-norm across heads), but the plan does not shard it; "
                    f"replicated it cannot normalize a sharded input. Add '{path}' (or its glob) as "
                    f"rmsnorm_across_heads."
                )


def _normalized_width(module: nn.Module) -> int | None:
    """The one normalized dim of a norm-like module (`normalized_shape` or diffusers' `dim`), else None."""
    if "Norm" not in type(module).__name__:
        return None
    shape = getattr(module, "normalized_shape", None) or getattr(module, "dim", None)
    try:
        shape = tuple(shape)
    except TypeError:
        return None
    return int(shape[0]) if len(shape) == 1 else None


def _norm_spec(plan: Plan, rule: Rule, path: str, module: nn.Module) -> NormSpec:
    shape = getattr(module, "normalized_shape", None) or getattr(module, "dim", None)
    if type(module).__name__ not in NORM_CLASS_NAMES or shape is None or len(tuple(shape)) != 1:
        raise PlanError(
            f"plan {plan.name}, key '{rule.key}': '{path}' is a {type(module).__name__}; "
            f"'{rule.style.value}' applies to RMSNorm modules over one dim (torch nn.RMSNorm, diffusers RMSNorm)."
        )
    names = tuple(n for n in ("weight", "bias") if getattr(module, n, None) is not None)
    return NormSpec(path=path, rule=rule, width=int(tuple(shape)[0]), eps=module.eps, param_names=names)


def _check_follows_colwise(plan: Plan, spec: NormSpec, colwise: list[LinearSpec]) -> None:
    """The norm's width must be a colwise sibling's output width: only then is its input sharded."""
    parent = spec.path.rpartition(".")[0]
    siblings = [s for s in colwise if s.path.rpartition(".")[0] == parent]
    widths = sorted({sum(s.sizes) for s in siblings})
    if spec.width not in widths:
        raise PlanError(
            f"plan {plan.name}, key '{spec.rule.key}': '{spec.path}' normalizes {spec.width} features but no colwise "
            f"Linear in '{parent or '<model>'}' produces that width ({widths or 'none'}); '{spec.rule.style.value}' "
            f"is for a norm over a sharded q/k projection. Leave a norm over whole activations unplanned."
        )
