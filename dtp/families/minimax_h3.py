"""MiniMaxH3Transformer3DModel family (MiniMax-H3): one stack of self-attention blocks over one packed sequence
[text | audio | video] of a request (video and audio generated together), AdaLN modulation per row from a
(timestep, modality) table, a text token refiner; no cross-attention."""

from __future__ import annotations

import torch

from .geometry import Geometry

CLASS_NAME = "MiniMaxH3Transformer3DModel"
PLAN = "minimax_h3"

RELEASED: dict = {}  # the class defaults are the released checkpoint's config (its docstring)
TINY = dict(
    num_attention_heads=4,
    attention_head_dim=16,
    hidden_size=48,  # as released, heads x head_dim (64) is wider than the residual stream
    num_layers=2,
    num_refiner_layers=1,
    ffn_dim=64,
    in_channels=4,
    audio_in_channels=8,
    text_dim=32,
    freq_dim=32,
    time_embed_hidden_dim=48,
    time_embed_dim=24,
    rope_freq_dim=2,  # 2 x 3 x 2 = 12 of the 16 head channels rotated, the rest passed through, as released
)
# The modular pipeline: a 16x VAE (canvas multiple 32 with patch 2), 17-frame chunks encoded into 5 latent frames
# (about 3.4x in time, given here as 4x: the Geometry's (F - 1) / t + 1 rule), 5 s at 24 fps; one call per step
# (guidance-distilled); the canvas rounds to multiples of 32 (704 x 1280 for 720p, an assumed usual canvas). Full-size
# inputs come from the family's builder with the video token count.
GEOMETRY = Geometry(vae_scale=16, vae_time_scale=4, clip=(121, 704, 1280), layout="video_packed")
AUDIO_ROWS = 4  # audio latent rows in the inputs (stereo: two channel-major blocks of 2)
TAGS = {"video": 0, "text": 1, "audio": 2}  # diffusers' modality tags


def inputs(cfg, g, batch, img, txt):
    """One packed request [text | audio | video], repeated over the batch (the structural tensors describe one
    layout every item shares); two noise levels: the text at index 0, audio and video at index 1."""
    rows = {"text": txt, "audio": AUDIO_ROWS, "video": img}
    starts = {"text": 0, "audio": txt, "video": txt + AUDIO_ROWS}
    indices = {name: torch.arange(starts[name], starts[name] + n) for name, n in rows.items()}
    tags = torch.cat([torch.full((n,), TAGS[name]) for name, n in rows.items()])
    patch = cfg.get("patch_size", (1, 2, 2))
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"] * patch[0] * patch[1] * patch[2], generator=g),
        audio_hidden_states=torch.randn(batch, AUDIO_ROWS, cfg["audio_in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_dim"], generator=g),
        timestep=torch.rand(2, generator=g),
        timestep_indices=(tags != TAGS["text"]).long(),
        token_tags=tags,
        position_ids=_positions(rows),
        video_indices=indices["video"],
        audio_indices=indices["audio"],
        text_indices=indices["text"],
        return_dict=False,
    )


def _positions(rows: dict) -> torch.Tensor:
    """(t, h, w) rotary coordinates: text along t, audio along t at the grid's edge, video on a 2-frame grid of
    rows of 4 (one frame when the count is odd)."""
    video = rows["video"]
    frames = 2 if video % 2 == 0 else 1
    i = torch.arange(video)
    grid = torch.stack([i // (video // frames), (i % (video // frames)) // 4, i % 4], dim=-1)
    text = torch.stack([torch.arange(rows["text"]), *[torch.zeros(rows["text"], dtype=torch.long)] * 2], dim=-1)
    audio = torch.stack([torch.arange(rows["audio"]), torch.zeros(rows["audio"], dtype=torch.long),
                         torch.full((rows["audio"],), 3)], dim=-1)  # fmt: skip
    return torch.cat([text, audio, grid])
