"""Expert-choice routing under CP: the whole sequence's top-k, made from gathered router scores.

Nucleus-Image's `NucleusMoELayer` lets every expert take the C tokens of the WHOLE image sequence that score highest
for it (`torch.topk` over the sequence, C = ceil(capacity_factor x S / E)), and normalizes each token's routing
weights over the experts that took it. A rank holding S / cp tokens would pick among its own tokens only, with its
own capacity: another choice. Under CP the layer runs `ExpertChoiceCp.forward` instead:

    scores_r  = softmax(gate([temb, x_r]))                 [B, S/cp, E]   per token, as one process
    scores    = all_gather(scores_r) along the sequence    [B, S, E]      the gathered region (B S E values)
    top-k, weights, per-token sums                         as one process, on every rank (the same ties: the same
                                                           tensor in the same global order)
    entries whose token is this rank's                     global index g = b S + t -> local b S/cp + t - r S/cp

Each rank then runs the experts on its own chosen tokens only (kept in expert order, so they are still grouped by
expert with per-expert counts) and scatter-adds them into its tokens' shared-expert output: exact up to summation
order. Shapes stay static (no host read of device data, as diffusers' grouped-matmul path): the rank's entries are
packed first into a buffer of all E B C entries, the rest point at a spare row and carry no weight; the experts'
grouped matmul (or diffusers' loop, which strips the buffer's tail itself) computes only the counted rows.

Example: S = 16 tokens, E = 4 experts, capacity factor 2 -> C = 8; cp = 2: rank 1 owns tokens 8..15; expert 0 took
tokens [3, 9, 12, 0, 15, 4, 5, 11] -> rank 1 runs expert 0 on its local tokens [1, 4, 7, 3] (global 9, 12, 15, 11).

Cost per MoE layer and rank: one all-gather of B S E router scores (Nucleus-Image at 1024^2: 1 x 4096 x 64 bf16 =
0.5 MB), the [B, E, S] top-k on every rank, and an entry buffer of E B C rows (the whole layer's routed tokens,
C = 2 x 4096 / 64 = 128: 8192 rows, 32 MB in bf16 at width 2048) whatever cp is: the routed work is split, not the
buffer, because a rank may own any share of the chosen tokens (all of them, in the worst case).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...errors import ForwardError
from ...styles.collectives import all_gather_along

KIND = "expert_choice"  # `cp.gathered` kind (plan/cp.py)
CLASSES = ("NucleusMoELayer",)  # the module classes that route by expert choice over the sequence


def whole_choice(scores: torch.Tensor, capacity_factor: float, route_scale: float):
    """`(global token index [E B C], routing weight [E B C])` of expert-choice routing over `scores` [B, S, E] (the
    whole sequence), expert-major as `NucleusMoELayer.forward` lays them out: diffusers' own math, unchanged."""
    batch, tokens, experts = scores.shape
    affinity = scores.transpose(1, 2)  # [B, E, S]
    capacity = max(1, math.ceil(capacity_factor * tokens / experts))
    top = torch.topk(affinity, k=capacity, dim=-1).indices  # [B, E, C]
    gating = affinity.gather(dim=-1, index=top)
    offsets = torch.arange(batch, device=scores.device, dtype=torch.long).view(batch, 1, 1) * tokens
    index = (offsets + top).transpose(0, 1).reshape(-1)
    weight = gating.transpose(0, 1).reshape(-1)
    sums = torch.zeros(batch * tokens, device=scores.device, dtype=weight.dtype).scatter_add_(0, index, weight)
    return index, weight / (sums[index] + 1e-12) * route_scale


def own_entries(index: torch.Tensor, tokens: int, rank: int, cp: int, experts: int):
    """This rank's routed entries, packed first and still grouped by expert, in a buffer of every entry.

    index: the global token index `b S + t` of each entry [E B C] (expert-major); the rank owns t in
    [r S / cp, (r + 1) S / cp). Returns `(order, row, mine, counts)`: buffer slot i holds entry `order[i]`; `row` its
    local token row `b S / cp + t - r S / cp` (0 for an entry another rank owns, which carries no weight); `mine`
    whether the rank owns it; `counts[e]` the rank's entries of expert e (the first sum(counts) slots are the rank's,
    in diffusers' order). 16 tokens, cp 2, rank 1, batch 1: global 9 -> local row 1; global 3 -> not the rank's."""
    local = tokens // cp
    sample, position = index // tokens, index % tokens - rank * local
    own = (position >= 0) & (position < local)
    expert = torch.arange(experts, device=index.device).repeat_interleave(index.numel() // experts)
    order = torch.argsort(torch.where(own, expert, experts), stable=True)  # own entries first, in expert order
    row = torch.where(own, sample * local + position, torch.zeros_like(index))
    return order, row[order], own[order], own.view(experts, -1).sum(dim=1)


class ExpertChoiceCp:
    """`NucleusMoELayer.forward` on a rank's tokens, routed over the whole sequence (module docstring)."""

    def __init__(self, layer: nn.Module, group):
        self.layer, self.group = layer, group

    def router_scores(self, hidden_states, hidden_states_unmodulated, timestep):
        """[B, S/cp, E]: the layer's router on the rank's tokens (per token: as one process)."""
        layer = self.layer
        router_input = hidden_states_unmodulated
        if timestep is not None:
            expanded = timestep.unsqueeze(1).expand(-1, hidden_states.shape[1], -1)
            router_input = torch.cat([expanded, hidden_states_unmodulated], dim=-1)
        logits = layer.gate(router_input)
        if layer.use_sigmoid:
            return torch.sigmoid(logits.float()).to(logits.dtype)
        return F.softmax(logits.float(), dim=-1).to(logits.dtype)

    def __call__(self, hidden_states, hidden_states_unmodulated, timestep=None):
        layer, cp, rank = self.layer, dist.get_world_size(self.group), dist.get_rank(self.group)
        batch, local, dim = hidden_states.shape
        scores = self.router_scores(hidden_states, hidden_states_unmodulated, timestep)
        whole = all_gather_along(scores, self.group, 1)  # [B, S, E]: the gathered region
        index, weight = whole_choice(whole, layer.capacity_factor, layer.route_scale)
        order, row, own, counts = own_entries(index, local * cp, rank, cp, layer.num_experts)
        routed = layer.experts(hidden_states.reshape(batch * local, dim)[row], counts)
        weighted = routed.float() * weight[order].unsqueeze(-1)
        weighted = torch.where(own.unsqueeze(-1), weighted, 0.0).to(hidden_states.dtype)  # others' rows: exactly 0
        out = layer.shared_expert(hidden_states).reshape(batch * local, dim)
        out = out.scatter_add(dim=0, index=row.unsqueeze(-1).expand(-1, dim), src=weighted)
        return out.reshape(batch, local, dim)


class _Restore:
    """A hook-handle look-alike: `remove()` gives the layer its own forward back."""

    def __init__(self, layer: nn.Module):
        self.layer = layer

    def remove(self) -> None:
        self.layer.__dict__.pop("forward", None)


def install_expert_choice(layer: nn.Module, path: str, group) -> list:
    """Run `layer` (a `CLASSES` module) as `ExpertChoiceCp` on the `cp` group; returns a restore handle."""
    if type(layer).__name__ not in CLASSES:
        raise ForwardError(f"cp.gathered '{path}': {type(layer).__name__} has no expert-choice CP forward.")
    layer.forward = ExpertChoiceCp(layer, group)  # an instance attribute: found before the class's forward
    return [_Restore(layer)]
