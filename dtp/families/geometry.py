"""What a family's released pipeline generates, in the transformer's terms: pixels per token, VAE factors, clip, CFG.

A family module may declare `GEOMETRY = Geometry(...)`; one that does not gets `Geometry()`, the image DiT most
families are: an 8x VAE, 2 x 2 latent pixels per token, no usual clip, CFG (if any) as one call on a doubled batch.

    tokens of an H x W image      (H / pixels_per_token) x (W / pixels_per_token)
                                  e.g. FLUX.1 at 1024^2: VAE 8x, patch 2 -> 64 x 64 = 4096 tokens
    latent video of F frames      (F - 1) / vae_time_scale + 1 frames of H / vae_scale x W / vae_scale latent pixels
                                  e.g. Wan at 81 x 480 x 832: VAE 4x in time, 8x in space -> 21 x 60 x 104,
                                  patch 1 x 2 x 2 -> 21 x 30 x 52 = 32,760 tokens
"""

from __future__ import annotations

from dataclasses import dataclass

# How the transformer takes its latents (`hidden_states`); the image layouts are built by each family's `inputs`
# from a token count, the video ones are replaced by the full-size latent video (`analysis/inputs.py`).
LAYOUTS = ("image", "video", "video_fchw", "video_tokens", "video_packed")


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """One family's released pipeline, as the sizes of a generation see it."""

    vae_scale: int = 8
    """Pixels per latent pixel, each side (the VAE's spatial compression): 8, or 32 for Sana, HunyuanImage, LTX."""
    patch: int = 2
    """Latent pixels per token side, the pipeline's packing included (FLUX.1 packs 2 x 2 latents into one token)."""
    vae_time_scale: int = 1
    """Frames per latent frame after the first (the VAE's temporal compression); 1 for an image model."""
    patch_t: int = 1
    """Latent frames per token (every bundled video transformer: 1)."""
    clip: tuple[int, int, int] | None = None
    """The usual clip (frames, height, width) in pixels of a video pipeline; None for an image model."""
    two_call_cfg: bool = False
    """The released pipeline runs classifier-free guidance as two transformer calls per step at its recommended
    settings (Qwen-Image's true CFG, Wan); False: one call (a doubled batch, or guidance-distilled like FLUX.1-dev)."""
    layout: str = "image"
    """`hidden_states` layout: "image" (built from a token count by the family), "video" [B, C, F, H, W],
    "video_fchw" [B, F, C, H, W] (CogVideoX), "video_tokens" [B, F H W, C] with the grid beside it (LTX),
    "video_packed" (inputs that all follow the video token count: MiniMax-H3's packed sequence and its index
    tensors, Allegro's RoPE positions): the family builds every input from the token count, as for an image."""

    grid_inputs: tuple[str, ...] = ()
    """Other inputs laid out on the same latent grid as `hidden_states` (layout "video"), each with its own channels:
    Wan VACE's `control_hidden_states`."""

    def __post_init__(self):
        assert self.layout in LAYOUTS, self.layout
        assert (self.clip is None) == (self.layout == "image"), "a video layout comes with a usual clip"

    @property
    def pixels_per_token(self) -> int:
        """Image pixels per token side: vae_scale x patch (16 for most, 32 for Sana and HunyuanImage 2.1)."""
        return self.vae_scale * self.patch

    @property
    def is_video(self) -> bool:
        return self.clip is not None


IMAGE = Geometry()
