"""Per-rank head bookkeeping on attention modules.

After q/k/v are split colwise each rank computes `heads / tp` heads, but diffusers' processors read
the head layout from the module: 20 of 25 reshape with `attn.heads`, Qwen-Image computes
`attn.inner_dim // attn.heads`, Flux2's fused single-stream processor splits by the ratio of
`inner_dim` to `mlp_hidden_dim`. So every count and width below is rewritten to its local value
together (`head_dim` is per head and stays). Without QK-norm a missed rewrite is silently wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .resolve_types import Constraint

# Head counts (must divide by tp) and the widths derived from them, when the module has them.
HEAD_ATTRS = ("heads", "kv_heads", "num_heads", "num_kv_heads")
WIDTH_ATTRS = ("inner_dim", "inner_kv_dim", "mlp_hidden_dim")


@dataclass(frozen=True)
class AttentionSpec:
    """An attention module and the global values of the attributes that become per-rank."""

    path: str
    key: str  # the `attention` glob (or "<inferred>") that selected it
    values: tuple[tuple[str, int], ...]  # (attribute, global value)

    def constraints(self) -> list[Constraint]:
        return [Constraint(value, f"{attr} of {self.path}", self.key) for attr, value in self.values]

    def local_values(self, tp: int) -> dict[str, int]:
        return {attr: value // tp for attr, value in self.values}


def attention_spec(path: str, module: nn.Module, key: str) -> AttentionSpec | None:
    """The spec for `module`, or None when it has no integer `heads` (not an attention module)."""
    if not _is_int(getattr(module, "heads", None)):
        return None
    values = tuple(
        (attr, getattr(module, attr))
        for attr in HEAD_ATTRS + WIDTH_ATTRS
        if _is_int(getattr(module, attr, None))
    )
    return AttentionSpec(path=path, key=key, values=values)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def set_local_heads(model: nn.Module, specs, tp: int) -> None:
    """Rewrite each spec'd module's counts and widths to their per-rank values."""
    for spec in specs:
        module = model.get_submodule(spec.path)
        for attr, value in spec.local_values(tp).items():
            setattr(module, attr, value)
