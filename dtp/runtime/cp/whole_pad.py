"""A model's own mask over the whole (unpadded) sequence, padded with the sequence (OmniGen's `[B, 1, S, S]`).

OmniGen's pipeline builds one additive mask over the joint sequence, which differs per query; Ulysses applies it whole
(`masks.whole_mask`). When the plan pads that sequence at its end to a multiple of cp (`pad: {at: last}`, `PadState`),
the model's mask still has the unpadded length S, so it would not read as whole. This pads it to the padded length
P: the pad keys masked for every query (False, or the dtype's minimum for an additive mask: a finite value, so a row
never becomes all -inf), the pad queries' rows seeing the real keys (their rows are dropped at the gather's `trim`).
Example: S = 25, cp = 2: P = 26, column 25 masked, row 25 = [0] * 25 + [min].
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def pad_whole_mask(attn_mask, query: torch.Tensor, group, pads):
    """`attn_mask` padded to the padded sequence when it is a `[B|1, 1, S, S]` mask over the unpadded whole sequence
    of `pads`' `last` slot (S = the slot's total, cp x the local query length > S); else `attn_mask` unchanged."""
    slot = None if pads is None else pads.slots.get("last")
    if slot is None or not slot.padded or not isinstance(attn_mask, torch.Tensor) or attn_mask.ndim != 4:
        return attn_mask
    total, length = slot.total, query.shape[1] * dist.get_world_size(group)
    if attn_mask.shape[1] != 1 or tuple(attn_mask.shape[-2:]) != (total, total) or length <= total:
        return attn_mask
    extra, seen = length - total, True if attn_mask.dtype == torch.bool else 0.0
    padded = F.pad(attn_mask, (0, 0, 0, extra), value=seen)  # the pad queries' rows: every real key seen
    return F.pad(padded, (0, extra), value=masked_value(attn_mask.dtype))  # the pad keys: masked for every query


def masked_value(dtype: torch.dtype):
    """What masks a key in a mask of `dtype`: False, or the dtype's minimum for an additive mask (finite, as the
    model's own mask uses it: a row never becomes all -inf)."""
    return False if dtype == torch.bool else torch.finfo(dtype).min
