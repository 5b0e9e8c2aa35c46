"""Token-grid helpers shared by the input builders."""

from __future__ import annotations

import torch


# Issue 10 coverage. Prompts are batch-padded where the model takes a text mask: sample 1 has its last
# quarter of text tokens masked out, so the sharded and reference runs both see a padded prompt.
def text_mask(batch, txt):
    """[batch, txt] ones, the second sample right-padded by a quarter (a padded prompt)."""
    mask = torch.ones(batch, txt, dtype=torch.long)
    if batch > 1:
        mask[1, txt - max(1, txt // 4) :] = 0
    return mask


def square_side(img, patch=1):
    side = int(img**0.5)
    assert side * side == img, f"{img} image tokens is not a square"
    return side * patch


def video_grid(img):
    """(frames, height, width) in tokens for `img` tokens: 2 frames of 2 x img/4 (a multiple of 4)."""
    assert img % 4 == 0, f"{img} video tokens must be a multiple of 4 (2 frames x 2 rows)"
    return 2, 2, img // 4
