"""Eager flex attention that honours a BlockMask's block sparsity, as compiled flex does.

Kandinsky 6 SR builds NABLA's BlockMask with `from_kv_blocks(..., mask_mod=None)`: the compiled flex kernel visits
the listed blocks only, but eager flex (what runs on CPU, and under diffusers without `compile_repeated_blocks`)
applies the mask_mod (None: keep everything) to every block, so it computes dense attention and the block mask has no
effect. On CPU a test that should see the mask (a wrong mask must fail) enters `sparse_flex()`: every BlockMask built
from kv blocks then also carries a mask_mod that keeps exactly the listed blocks, so eager flex computes what the
compiled kernel computes. Measured: a [[1, 0], [0, 1]] block mask over 128 tokens gives dense attention eagerly
(max |eager - dense| = 0) and block-diagonal attention inside `sparse_flex()`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.nn.attention.flex_attention import BlockMask


def listed_blocks(num_blocks, indices, full_num_blocks=None, full_indices=None) -> torch.Tensor:
    """[B, H, nq, nk] bool: the kv blocks a BlockMask lists per query block (partial and full)."""
    nk = indices.shape[-1]
    dense = torch.zeros(indices.shape, dtype=torch.bool, device=indices.device)
    for count, where in ((num_blocks, indices), (full_num_blocks, full_indices)):
        if count is None:
            continue
        listed = torch.arange(nk, device=where.device) < count.unsqueeze(-1)
        dense |= torch.zeros_like(dense).scatter_(-1, where.long(), listed)
    return dense


@contextmanager
def sparse_flex():
    """Inside: a BlockMask built from kv blocks without a mask_mod gets one that keeps the listed blocks (module
    docstring)."""
    original = BlockMask.from_kv_blocks

    def from_kv_blocks(num, indices, full_num=None, full_indices=None, BLOCK_SIZE=128, mask_mod=None, **kwargs):  # noqa: N803
        if mask_mod is None:
            listed = listed_blocks(num, indices, full_num, full_indices)
            size_q, size_kv = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else BLOCK_SIZE

            def mask_mod(b, h, q, kv):
                return listed[b, h, q // size_q, kv // size_kv]

        return original(num, indices, full_num, full_indices, BLOCK_SIZE=BLOCK_SIZE, mask_mod=mask_mod, **kwargs)

    BlockMask.from_kv_blocks = from_kv_blocks
    try:
        yield
    finally:
        BlockMask.from_kv_blocks = original
