"""WanAnimateTransformer3DModel family (Wan 2.2 Animate): Wan 2.1's blocks plus a pose embedding, a motion encoder
over face crops, a face encoder and face-adapter cross-attentions after every `inject_face_latents_blocks` blocks."""

from __future__ import annotations

import torch

from . import wan
from .shapes import video_grid

CLASS_NAME = "WanAnimateTransformer3DModel"
PLAN = "wan_animate"

# Wan's tiny blocks with an 8 x 8 face crop (the motion encoder halves it once: channels at sides 8 and 4), a face
# adapter after each block, and the released image branch: CLIP tokens embedded to the model width, then attn2's own
# k / v of them (added_kv_proj_dim = inner width, as 5120 in the release).
TINY = {
    **{k: v for k, v in wan.TINY.items() if k not in ("in_channels", "out_channels")},
    "latent_channels": 4,
    "in_channels": 12,  # 2 x latent_channels + 4: noisy latents, reference latents, mask
    "out_channels": 4,
    "image_dim": 16,
    "added_kv_proj_dim": 64,
    "motion_encoder_channel_sizes": {"8": 8, "4": 8},
    "motion_encoder_size": 8,
    "motion_style_dim": 16,
    "motion_dim": 4,
    "motion_encoder_dim": 16,
    "face_encoder_hidden_dim": 16,
    "face_encoder_num_heads": 2,
    "inject_face_latents_blocks": 1,
    "motion_encoder_batch_size": 2,
}

RELEASED = {"added_kv_proj_dim": 5120}  # Wan2.2-Animate-14B (diffusers' convert_wan_to_diffusers.py); the rest defaults
TEXT_TOKENS = wan.I2V_TEXT_TOKENS  # with the image branch, attn2 takes the last 512 key tokens as the text (Wan I2V)

GEOMETRY = wan.GEOMETRY  # Wan 2.1's VAE (4x in time, 8x in space) and clip


def inputs(cfg, g, batch, img, txt):
    """Latents of F frames, pose latents of F - 1, and face crops whose count the face encoder (two stride-2
    causal convs, then one padding frame) turns back into F motion frames: the face adapter pairs them by position.
    """
    pt, ph, pw = cfg["patch_size"]
    f, h, w = video_grid(img)
    shape = (h * ph, w * pw)
    face_frames = 2 * (f - 1) if f > 2 else 1  # ceil(ceil(n / 2) / 2) + 1 == f
    side = cfg["motion_encoder_size"]
    txt = TEXT_TOKENS if cfg.get("added_kv_proj_dim") else txt
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f * pt, *shape, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_dim"], generator=g),
        encoder_hidden_states_image=torch.randn(batch, 4, cfg["image_dim"], generator=g),
        pose_hidden_states=torch.randn(batch, cfg["latent_channels"], f * pt - 1, *shape, generator=g),
        face_pixel_values=torch.rand(batch, 3, face_frames, side, side, generator=g) * 2 - 1,
        return_dict=False,
    )


def regrid(kwargs, grid):
    """Full-size inputs (`analysis/inputs.py`): pose latents of f - 1 frames on the latent grid and 4 (f - 1) - 3 face
    crops (the pipeline's 77 for 21 latent frames), which the face encoder's two stride-2 causal convs and its padding
    frame turn into f motion frames."""
    f, h, w = grid
    pose, face = kwargs["pose_hidden_states"], kwargs["face_pixel_values"]
    batch = pose.shape[0]
    kwargs["pose_hidden_states"] = torch.empty(
        (batch, pose.shape[1], f - 1, h, w), dtype=pose.dtype, device=pose.device
    )
    shape = (batch, face.shape[1], max(1, 4 * (f - 1) - 3), *face.shape[-2:])
    kwargs["face_pixel_values"] = torch.empty(shape, dtype=face.dtype, device=face.device)
    return kwargs
