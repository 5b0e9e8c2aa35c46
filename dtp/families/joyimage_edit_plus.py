"""JoyImageEditPlusTransformer3DModel family (JoyImage Edit Plus): JoyImage Edit's blocks over a flat, padded patch
sequence of the target and any number of reference images of their own sizes, with an image and text mask."""

from __future__ import annotations

import torch

from . import joyimage_edit
from .geometry import Geometry
from .shapes import text_mask

CLASS_NAME = "JoyImageEditPlusTransformer3DModel"
PLAN = "joyimage_edit_plus"

RELEASED: dict = {}  # the class defaults (no hub here: not checked against the released config)
TINY = dict(joyimage_edit.TINY)
PATCH = (1, 2, 2)  # the class default patch_size, pt x ph x pw latent pixels per patch
# JoyImage Edit's size; the patches are built by the family from their count (the target and one reference).
GEOMETRY = Geometry(vae_time_scale=4, clip=(1, 1024, 1024), layout="video_packed")


def inputs(cfg, g, batch, img, txt):
    """`img` patches per sample: the target (half of them) and one reference; sample 1's reference is half as large
    (its last img / 4 patches are padding, masked), and its prompt is padded too."""
    half = img // 2
    assert img % 4 == 0, f"{img} patches: the target and reference grids need a multiple of 4"
    shapes = [[(1, 2, half // 2), (1, 2, half // 2)], [(1, 2, half // 2), (1, 1, half // 2)]][:batch]
    shapes += [shapes[0]] * (batch - len(shapes))
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], *PATCH, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g).float(),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_dim"], generator=g),
        encoder_hidden_states_mask=text_mask(batch, txt),
        shape_list=shapes,
        return_dict=False,
    )
