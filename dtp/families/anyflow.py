"""AnyFlowTransformer3DModel family (AnyFlow flow-map sampling): the Wan 2.1 backbone (`wan.py`) with a dual timestep
embedder (source t, target r) whose modulation is broadcast over the tokens; per-frame latents [B, F, C, H, W]."""

from __future__ import annotations

import torch

from . import wan
from .geometry import Geometry

CLASS_NAME = "AnyFlowTransformer3DModel"
PLAN = "anyflow"

TINY = dict(wan.TINY)  # Wan's tiny widths: the same blocks
RELEASED: dict = {}  # the class defaults (the docstring: Wan 2.1 14B's widths, 40 heads of 128; not checked: no hub)
# Wan's VAE and clip; per-frame latents [B, F, C, H, W] as CogVideoX takes them; CFG as Wan's (two calls).
GEOMETRY = Geometry(vae_time_scale=4, clip=(81, 480, 832), two_call_cfg=True, layout="video_fchw")


def inputs(cfg, g, batch, img, txt):
    """Wan's inputs with the latents frame-major ([B, F, C, H, W]) and per-frame timesteps [B, F], as the pipeline
    passes them (it repeats one value; here each frame its own), the target r below the source t."""
    kwargs = wan.inputs(cfg, g, batch, img, txt)
    frames = kwargs["hidden_states"].shape[2]
    timestep = torch.randint(1, 1000, (batch, frames), generator=g)
    return {
        **kwargs,
        "hidden_states": kwargs["hidden_states"].transpose(1, 2),
        "timestep": timestep,
        "r_timestep": timestep // 2,
    }


def regrid(kwargs, grid):
    """Full-size inputs (`analysis/inputs.py`): per-frame timesteps for the f latent frames of the full-size grid."""
    f = grid[0]
    timestep = kwargs["timestep"]
    batch = timestep.shape[0]
    kwargs["timestep"] = torch.empty((batch, f), dtype=timestep.dtype, device=timestep.device)
    kwargs["r_timestep"] = torch.empty((batch, f), dtype=timestep.dtype, device=timestep.device)
    return kwargs
