"""WanVACETransformer3DModel family (Wan 2.1 / 2.2 VACE): forward inputs, tiny test config, released overrides."""

from __future__ import annotations

import torch

from . import wan
from .geometry import Geometry
from .shapes import video_grid

CLASS_NAME = "WanVACETransformer3DModel"
PLAN = "wan_vace"

# Wan's tiny config plus two VACE blocks (one per main block) over an 8-channel control video.
TINY = {**wan.TINY, "vace_layers": [0, 1], "vace_in_channels": 8}

RELEASED: dict = {}  # the diffusers class defaults are Wan2.1-VACE-14B's config

GEOMETRY = Geometry(
    vae_time_scale=4, clip=(81, 480, 832), two_call_cfg=True, layout="video", grid_inputs=("control_hidden_states",)
)


def inputs(cfg, g, batch, img, txt):
    """The video and a control video of the same token grid (as the VACE pipeline builds them)."""
    pt, ph, pw = cfg["patch_size"]
    f, h, w = video_grid(img)
    shape = (f * pt, h * ph, w * pw)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], *shape, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_dim"], generator=g),
        control_hidden_states=torch.randn(batch, cfg["vace_in_channels"], *shape, generator=g),
        control_hidden_states_scale=torch.rand(len(cfg["vace_layers"]), generator=g) + 0.5,
        return_dict=False,
    )
