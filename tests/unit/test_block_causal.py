"""Qwen-Image 2.1's block-causal mask as dtp's CP adapter builds it (`dtp/runtime/cp/block_causal.py`), against
diffusers' own definition (the `mask_mod` of `build_qwenimage21_block_causal_mask`, evaluated densely), over random
layouts of text runs and image blocks with right-padded prompts. Parity on processes: test_cp_coverage.py."""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_qwenimage21 as qwen
from hypothesis import given, settings
from hypothesis import strategies as st

from dtp.runtime.cp.block_causal import block_causal_mask

# runs before the target image: (is_text, length); the target image block comes last
_RUNS = st.lists(st.tuples(st.booleans(), st.integers(1, 5)), min_size=1, max_size=5)


def _image_ids(runs, target: int) -> torch.Tensor:
    ids, block = [], 0
    for is_text, length in runs:
        ids += [-1] * length if is_text else [block] * length
        block += not is_text
    return torch.tensor(ids + [block] * target)


def _diffusers_mask(image_ids: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """Dense [B, 1, S, S] from diffusers' mask_mod (its BlockMask pads to 128-token blocks; the mask_mod is exact)."""
    batch, length = key_valid.shape
    block_mask = qwen.build_qwenimage21_block_causal_mask(image_ids, key_valid, batch, "cpu")
    b, q, k = torch.meshgrid(torch.arange(batch), torch.arange(length), torch.arange(length), indexing="ij")
    return block_mask.mask_mod(b, torch.zeros_like(b), q, k)[:, None]


@settings(max_examples=40, deadline=None)
@given(runs=_RUNS, target=st.integers(1, 6), pad=st.integers(0, 3))
def test_mask_equals_diffusers_block_causal_mask(runs, target, pad):
    image_ids = _image_ids(runs, target)
    length = image_ids.shape[0]
    prefix = length - target
    key_valid = torch.ones(2, length, dtype=torch.bool)
    text = (image_ids < 0).nonzero().flatten()
    key_valid[1, text[len(text) - min(pad, len(text) - 1) :] if len(text) > 1 else text[:0]] = False
    segments = qwen._qwenimage21_prefix_segments(image_ids, prefix)
    ours = block_causal_mask(segments, key_valid, length, "cpu")
    assert torch.equal(ours, _diffusers_mask(image_ids, key_valid))


def test_a_condition_image_sees_itself_whole_and_text_is_causal():
    """[text 2, image 3, text 1] + target 2: the image block attends both ways, text only backwards."""
    image_ids = torch.tensor([-1, -1, 0, 0, 0, -1, 1, 1])
    mask = block_causal_mask(qwen._qwenimage21_prefix_segments(image_ids, 6), None, 8, "cpu")[0, 0]
    assert mask[2].tolist() == [True] * 5 + [False] * 3  # image query: up to the end of its block
    assert mask[0].tolist() == [True] + [False] * 7  # first text query: itself only
    assert mask[6].all() and mask[7].all()  # target: everything
