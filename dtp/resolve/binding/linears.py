"""Planned Linears (and Embeddings): which rule matched each one, and the `Layout` of its weight and bias.

The bias rule lives here and only here: a colwise bias follows the output features (split like the
weight's rows); a rowwise bias is added once (tp rank 0 adds it to its partial sum), so every rank holds it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from ...errors import PlanError
from ...plan import Plan, Rule, Style
from ..layout import Layout, block_sizes
from .constraints import Constraint
from .globs import expand


@dataclass(frozen=True)
class LinearSpec:
    """One planned Linear (or Embedding, for the embedding styles): its path, the rule that matched it, and its
    blocks along the split dim."""

    path: str
    rule: Rule
    sizes: tuple[int, ...]  # absolute block sizes along `rule.style.shard_dim`
    has_bias: bool
    padded_sizes: tuple[int, ...] | None = None  # set by `padding.pad_resolved` (pad=True); None: unpadded
    groups: int = 1  # query heads grouped by shared kv head (kv_share.py): segments padded on their own
    replicas: int = 1  # a shared kv projection (kv_share.py): ranks holding the same rows

    @property
    def style(self) -> Style:
        return self.rule.style

    @property
    def weight_layout(self) -> Layout:
        return Layout(self.style.shard_dim, self.sizes, self.padded_sizes, self.groups, self.replicas)

    def param_layouts(self) -> dict[str, Layout | None]:
        """`{param name: Layout}`, `None` for a parameter every rank holds whole (a rowwise bias)."""
        layouts = {"weight": self.weight_layout}
        if self.has_bias:
            layouts["bias"] = replace(self.weight_layout, dim=0) if self.style.splits_bias else None
        return layouts

    def constraints(self) -> list[Constraint]:
        if len(self.sizes) == 1:
            return [Constraint(self.sizes[0], f"dim {self.style.shard_dim} of {self.path}", self.rule.key)]
        # Every block on its own: a sum that divides is not enough (the ranks would cut across blocks).
        return [
            Constraint(size, f"packed block {i} (of {list(self.sizes)}) of {self.path}", self.rule.key)
            for i, size in enumerate(self.sizes)
        ]


@dataclass(frozen=True)
class ExpertsSpec(LinearSpec):
    """A module of SwiGLU experts (`experts` style, `styles/experts.py`): a LinearSpec, so that everything reading
    planned weights (apply, the loader, `dtp check`, the rank fingerprint) takes it as it is; only the parameters
    differ. `sizes` are the gate and up blocks of `gate_up_proj`'s columns, `(I, I)`; `down_proj`'s rows are the
    one block `(I,)`. pad=True leaves them unpadded (`padding.pad_resolved` refuses an I that tp does not divide)."""

    def param_layouts(self) -> dict[str, Layout | None]:
        assert self.padded_sizes in (None, self.sizes), "experts are never padded"
        return {"gate_up_proj": Layout(2, self.sizes), "down_proj": Layout(1, self.sizes[:1])}


def resolve_linears(plan: Plan, model: nn.Module) -> list[LinearSpec]:
    """One LinearSpec per Linear the plan's rules address; PlanError for non-Linears and double matches."""
    specs: dict[str, LinearSpec] = {}
    for rule in plan.rules:
        if not rule.style.is_linear:  # norms resolve in norms.py, shard_output modules in outputs.py
            continue
        for path, module in expand(model, rule.key, plan.name, optional=rule.optional):
            _check_target(plan, rule, path, module)
            if path in specs:
                raise PlanError(
                    f"plan {plan.name}: '{path}' is matched by both '{specs[path].rule.key}' and '{rule.key}'."
                )
            if rule.style is Style.EXPERTS:  # accepts() checked the two 3-D parameters
                hidden = module.down_proj.shape[1]
                specs[path] = ExpertsSpec(path, rule, (hidden, hidden), has_bias=False)
                continue
            has_bias = getattr(module, "bias", None) is not None  # an Embedding has none
            specs[path] = LinearSpec(path, rule, _sizes(plan, rule, path, module), has_bias)
    return list(specs.values())


def _check_target(plan: Plan, rule: Rule, path: str, module: nn.Module) -> None:
    """The style says which modules it can split (`Style.accepts`): an nn.Linear for the linear styles, an
    nn.Embedding without max_norm for the embedding styles, ..."""
    reason = rule.style.accepts(module)
    if reason is not None:
        raise PlanError(f"plan {plan.name}, key '{rule.key}': '{path}' is a {_kind(module)}, {reason}.")


def _kind(module: nn.Module) -> str:
    """The class name, qualified when it reads like a torch one but is not (peft's `lora.Linear` is no nn.Linear)."""
    name, where = type(module).__name__, type(module).__module__
    return f"{where}.{name}" if name in ("Linear", "Embedding") and not where.startswith("torch.nn") else name


def _sizes(plan: Plan, rule: Rule, path: str, linear: nn.Linear) -> tuple[int, ...]:
    dim_size = linear.weight.shape[rule.style.shard_dim]
    if not rule.style.is_packed:
        return (dim_size,)
    blocks = rule.blocks
    if blocks is None:
        attr = rule.style.blocks_attr
        blocks = getattr(linear, attr, None)
        if not blocks:
            raise PlanError(
                f"plan {plan.name}, key '{rule.key}': '{path}' is '{rule.style.value}' but has no blocks; give "
                f"`blocks:` in the plan or set `{attr}` on the Linear."
            )
    try:
        return block_sizes(dim_size, blocks)
    except ValueError:
        raise PlanError(
            f"plan {plan.name}, key '{rule.key}': blocks {list(blocks)} (sum {sum(blocks)}) do not divide "
            f"dim {rule.style.shard_dim} of '{path}' (size {dim_size}); blocks are proportions whose sum divides "
            f"the dim, or absolute sizes that add up to it."
        ) from None
