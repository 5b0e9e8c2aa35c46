"""Cosmos3OmniTransformer family (Cosmos 3 Omni): a Qwen3-style decoder over one packed, unbatched sequence of a
causal text prefix ("understanding") and the video tokens ("generation"); every layer has separate projections,
norms and SwiGLU MLPs per pathway, and the generation queries attend to the keys of both (GQA)."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import video_grid

CLASS_NAME = "Cosmos3OmniTransformer"
PLAN = "cosmos3_omni"

RELEASED: dict = {}  # the class defaults (Qwen3-8B widths: 32 q / 8 kv heads of 128, 36 layers; not checked: no hub)
# 8 q / 4 kv heads of 16 (GQA as released), mRoPE sections summing to head_dim / 2; tp 1, 2, 4.
TINY = dict(
    head_dim=16,
    hidden_size=64,
    intermediate_size=128,
    latent_channel=4,
    latent_patch_size=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    num_hidden_layers=2,
    patch_latent_dim=16,
    vocab_size=64,
    rope_axes_dim=(4, 2, 2),
)
# Wan 2.2's VAE (16x in space, 4x in time) and 2 x 2 patches; 121 frames of 704 x 1280 assumed (Cosmos' clip); CFG
# as two calls (the pipeline's cond / uncond packs). Every input follows the token count (`video_packed`).
GEOMETRY = Geometry(vae_scale=16, vae_time_scale=4, clip=(121, 704, 1280), two_call_cfg=True, layout="video_packed")


def inputs(cfg, g, batch, img, txt):
    """One packed item, as the pipeline passes it (the model takes no batch: `batch` is not used): `txt` text tokens
    then a latent video of 2 frames of 2 x img/4 patches, frame 0 a clean condition (image to video), frame 1 noisy
    (its tokens alone get a timestep and are read back); 3-D positions, text on the diagonal, video after it."""
    f, h, w = video_grid(img)
    p, channels = cfg.get("latent_patch_size", 2), cfg.get("latent_channel", 48)
    latent = torch.randn(1, channels, f, h * p, w * p, generator=g)
    frame = h * w
    video_index = torch.arange(txt, txt + img)
    grid = torch.stack(torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij")).flatten(1)
    positions = torch.cat([torch.arange(txt).expand(3, -1), grid + txt], dim=1)
    return dict(
        input_ids=torch.randint(0, cfg.get("vocab_size", 151936), (txt,), generator=g),
        text_indexes=torch.arange(txt),
        position_ids=positions,
        und_len=txt,
        sequence_length=txt + img,
        vision_tokens=[latent],
        vision_token_shapes=[(f, h, w)],
        vision_sequence_indexes=video_index,
        vision_mse_loss_indexes=video_index[frame:],
        vision_timesteps=torch.rand(img - frame, generator=g) * 1000,
        vision_noisy_frame_indexes=[torch.arange(1, f)],
        return_dict=False,
    )
