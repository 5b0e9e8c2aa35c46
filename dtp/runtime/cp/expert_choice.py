"""Expert-choice routing under CP: the whole sequence's top-k, made from gathered router scores.

Nucleus-Image's `NucleusMoELayer` lets every expert take the C tokens of the WHOLE image sequence that score highest
for it (`torch.topk` over the sequence, C = ceil(capacity_factor x S / E)), and normalizes each token's routing
weights over the experts that took it. A rank holding S / cp tokens would pick among its own tokens only, with its
own capacity: another choice. Under CP the layer runs `ExpertChoiceCp` instead, a gathered region:

    scores_r = softmax(gate([temb, x_r]))          [B, S/cp, E]   per token, as one process
    scores   = all_gather(scores_r)                [B, S, E]      (B S E values: small)
    entries  = top-k, weights, per-token sums      [E B C]        diffusers' math on every rank: the same tensor in
                                                                  the same global order, so the same ties
    x        = all_gather(x_r)                     [B S, D]       the chosen tokens, wherever they live
    rank r runs the experts on entries [r N / cp, (r + 1) N / cp)  (N = E B C, expert-major: a static, even share)
    y        = reduce_scatter(scatter_add(its entries' weighted outputs into [B, S, D]))  each rank its own tokens
    out_r    = shared_expert(x_r) + y_r

Exact up to summation order (a token's expert outputs are summed across ranks). Shapes are static, with no host read
of device data, and every rank does 1 / cp of the routed work whoever owns the chosen tokens (expert-choice may pick
one region's tokens for every expert). Example: E = 4 experts, C = 8, batch 2, cp = 2: N = 64 entries; rank 1 runs
entries 32..63, experts 2 and 3 (16 each), on tokens of both ranks.

Cost per MoE layer and rank (Nucleus-Image at 1024^2, 4096 tokens, width 2048, E = 64, bf16): an all-gather of the
scores (0.5 MB) and of the tokens (16 MB) in, a reduce-scatter of the routed sum (16 MB) out; memory: the whole
tokens and the routed sum ([B, S, D] each) beside the rank's N / cp expert rows.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...errors import ForwardError
from ...styles.collectives import all_gather_along

_REDUCE_SCATTER = dist.ReduceScatterOptions()  # default options (a sum), built once
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


def entry_share(experts: int, per_expert: int, rank: int, cp: int) -> tuple[slice, list[int]]:
    """This rank's share of the N = E x per_expert expert-major entries, `[r N / cp, (r + 1) N / cp)`, and how many of
    them each expert has (static ints: the grouped matmul's counts). E = 4, 16 each, cp = 2, rank 1: entries 32..63,
    counts [0, 0, 16, 16]; cp = 3, rank 1: entries 21..41, counts [0, 11, 10, 0]."""
    total = experts * per_expert
    start, stop = rank * total // cp, (rank + 1) * total // cp
    counts = [max(0, min(stop, (e + 1) * per_expert) - max(start, e * per_expert)) for e in range(experts)]
    return slice(start, stop), counts


def reduce_scatter_tokens(x: torch.Tensor, group) -> torch.Tensor:
    """[B, S, D] partial sums on every rank -> [B, S/cp, D]: the sum over ranks of this rank's chunk of tokens."""
    cp = dist.get_world_size(group)
    batch, tokens, dim = x.shape
    chunks = x.view(batch, cp, tokens // cp, dim).transpose(0, 1).reshape(cp * batch, tokens // cp, dim)  # rank-major
    out = x.new_empty(batch, tokens // cp, dim)
    if torch.compiler.is_compiling():  # dynamo rewrites it to the functional collective (as `styles/collectives.py`)
        dist.reduce_scatter_single(out, chunks, group=group)
    else:  # the ProcessGroup's own call: no Python checks and loggers on the way
        group.reduce_scatter_single(out, chunks, _REDUCE_SCATTER).wait()
    return out


class ExpertChoiceCp:
    """`NucleusMoELayer.forward` on a rank's tokens, routed over the whole sequence (module docstring)."""

    def __init__(self, layer: nn.Module, group):
        self.layer, self.group = layer, group
        self.counts = {}  # (entries per expert, device) -> this rank's per-expert counts: a static tensor, built once

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
        index, weight = whole_choice(all_gather_along(scores, self.group, 1), layer.capacity_factor, layer.route_scale)
        per_expert = index.numel() // layer.num_experts
        share, counts = entry_share(layer.num_experts, per_expert, rank, cp)
        key = (per_expert, index.device)
        if key not in self.counts:
            self.counts[key] = torch.tensor(counts, device=index.device)
        index, weight = index[share], weight[share]
        tokens = all_gather_along(hidden_states, self.group, 1).reshape(batch * local * cp, dim)
        routed = layer.experts(tokens[index], self.counts[key])
        del tokens
        routed = (routed.float() * weight.unsqueeze(-1)).to(hidden_states.dtype)
        summed = hidden_states.new_zeros(batch * local * cp, dim)
        summed = summed.scatter_add_(0, index.unsqueeze(-1).expand(-1, dim), routed)
        mine = reduce_scatter_tokens(summed.view(batch, local * cp, dim), self.group)
        return layer.shared_expert(hidden_states) + mine


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
