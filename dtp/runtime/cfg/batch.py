"""Splitting one transformer call's batch over the cfg groups, and joining the groups' outputs back.

Doubled-batch pipelines (SD3, PixArt-Sigma, Sana, ...) call the transformer once per step on
`cat([uncond, cond])`; a list of prompts or `num_images_per_prompt` > 1 grows the same dimension.
Group g of `parts` takes rows [start_g, stop_g) as `torch.tensor_split` cuts them (the first
`batch % parts` groups take one row more), so any batch >= parts splits exactly:

    batch 2 over 2 groups -> rows [0, 1) and [1, 2)   (uncond on group 0, cond on group 1)
    batch 3 over 2 groups -> rows [0, 2) and [2, 3)

The batch is the size of the forward's first argument (dim 0 of `hidden_states`; the length of a
per-sample list such as Z-Image's `x`). Every tensor input whose dim 0 equals it is cut, wherever it
sits (`added_cond_kwargs` dicts too), and so is every top-level list of that length (Qwen-Image's
`img_shapes`), except the arguments in UNBATCHED: RoPE ids and tables are per token, not per sample,
and may be as long as the batch by chance. Transformers run each sample independently of the others
(no op mixes rows), so the joined output equals the one-call output.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .tree import map_tensors

UNBATCHED = frozenset({"img_ids", "txt_ids", "image_rotary_emb", "rotary_emb", "freqs_cis", "rope", "position_ids"})


def batch_size(arguments: Mapping) -> int | None:
    """The batch of a bound call: dim 0 of its first argument, or its length when that is a list."""
    first = next(iter(arguments.values()), None)
    if isinstance(first, torch.Tensor) and first.ndim > 0:
        return first.shape[0]
    if isinstance(first, list):
        return len(first)
    return None


def rows(batch: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of group `index`'s rows: `torch.tensor_split(range(batch), parts)[index]`."""
    base, extra = divmod(batch, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def split_arguments(arguments: Mapping, batch: int, start: int, stop: int) -> dict:
    """The bound arguments with rows [start, stop) of every batched input (see the module docstring)."""

    def cut(t: torch.Tensor) -> torch.Tensor:
        return t[start:stop] if t.ndim > 0 and t.shape[0] == batch else t

    out = {}
    for name, value in arguments.items():
        if name in UNBATCHED:
            out[name] = value
        elif isinstance(value, list) and len(value) == batch:
            out[name] = value[start:stop]
        else:
            out[name] = map_tensors(value, cut)
    return out


def join_parts(parts: list, sizes: list[int]):
    """The groups' outputs joined along the batch: tensors with dim 0 = their group's rows are
    concatenated, so are lists of per-sample items (Z-Image's output); anything else is taken from group 0."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        if all(p.ndim > 0 and p.shape[0] == n for p, n in zip(parts, sizes)):
            return torch.cat(parts)
        return first
    if isinstance(first, list) and all(len(p) == n for p, n in zip(parts, sizes)):
        return [item for p in parts for item in p]
    if isinstance(first, Mapping):
        joined = {key: join_parts([p[key] for p in parts], sizes) for key in first}
        return type(first)(**joined) if hasattr(first, "__dataclass_fields__") else type(first)(joined)
    if isinstance(first, (tuple, list)):
        return type(first)(join_parts([p[i] for p in parts], sizes) for i in range(len(first)))
    return first
