"""The plan shards the model exactly, or it is refused: the checks that need the TP degree bound to the plan.

`check_exact(resolved, model, tp)` runs, on a `Resolved` already bound to `tp` (padded, kv shared):
  1. declared blocks (`check_declared_blocks`): a packed rule's blocks are the ones the Linear declares;
  2. head alignment (`alignment.py`): every rank's q, k, v and o hold its whole heads, in one order;
  3. held sizes (`held_sizes.py`): no module outside attention reads a size a sharded output must match;
  4. data flow (`flow.py`): rank 0's forward on meta tensors with local shapes runs and returns the
     model's shapes (a colwise output without its rowwise consumer, a rowwise layer fed a whole tensor).
Each raises PlanError naming the key, the module and the rule; none mutates the model.
"""

from __future__ import annotations

from torch import nn

from ...errors import PlanError
from ..binding.held_sizes import check_held_sizes
from ..binding.resolved import Resolved
from ..layout import block_sizes
from .alignment import check_alignment
from .flow import check_flow


def check_exact(resolved: Resolved, model: nn.Module, tp: int) -> None:
    """Steps 1-4 above; the first failure raises."""
    check_declared_blocks(resolved, model)
    check_alignment(resolved, model, tp)
    check_held_sizes(resolved, model)  # issue 35: sizes held outside attention (held_sizes.py)
    check_flow(resolved, model, tp)


def check_declared_blocks(resolved: Resolved, model: nn.Module) -> None:
    """A fused Linear that declares its blocks (`_tp_packed_col_blocks`, set by diffusers) is split by those.

    Its forward splits its output (input) at those widths, so other blocks would mix q with k or the
    attention with the MLP on every rank. Example: FLUX.2's `to_qkv_mlp_proj` declares
    [3072, 3072, 3072, 18432]; `blocks: [1, 1, 1, 1]` would cut it into 4 x 6912: refused.
    """
    for spec in resolved.linears:
        attr = spec.style.blocks_attr
        declared = getattr(model.get_submodule(spec.path), attr, None) if attr else None
        if not declared or spec.rule.blocks is None:
            continue
        width = model.get_submodule(spec.path).weight.shape[spec.style.shard_dim]
        if block_sizes(width, declared) != spec.sizes:
            raise PlanError(
                f"plan {resolved.plan.name}, key '{spec.rule.key}': blocks {list(spec.rule.blocks)} cut '{spec.path}' "
                f"into {list(spec.sizes)}, but the layer declares blocks {list(declared)} ({attr}) and its forward "
                f"splits there; give blocks {list(declared)} or leave `blocks:` out."
            )
