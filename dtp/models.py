"""Known diffusers DiT classes by name, and forward inputs for them shaped by any config.

Used by `dtp check` (full-size shapes on the meta device), the tools that run a model on made-up
inputs, and the tiny test fixtures (`testing/tiny.py`), which feed the same builders a tiny config.
"""

from __future__ import annotations

import torch

from .errors import PlanError
from .resolve.flow import register_example_inputs


def model_class(class_name: str):
    """The diffusers class named `class_name`; PlanError when diffusers has none."""
    import diffusers

    cls = getattr(diffusers, class_name, None)
    if cls is None:
        raise PlanError(f"diffusers has no class named '{class_name}'.")
    return cls


def example_inputs(
    class_name: str, config: dict, *, seed: int = 1, batch: int = 1, img_tokens: int = 16, txt_tokens: int = 8
) -> dict:
    """Keyword arguments for one forward of a `class_name` model built from `config` (same on every rank
    for a fixed seed). PlanError for a class without an input builder."""
    if class_name not in INPUT_BUILDERS:
        raise PlanError(
            f"no input builder for {class_name}; known: {', '.join(sorted(INPUT_BUILDERS))}. Pass the inputs yourself."
        )
    g = torch.Generator().manual_seed(seed)
    return INPUT_BUILDERS[class_name](config, g, batch, img_tokens, txt_tokens)


def _flux_inputs(cfg, g, batch, img, txt):
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        pooled_projections=torch.randn(batch, cfg["pooled_projection_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        img_ids=torch.randint(0, 8, (img, 3), generator=g).float(),
        txt_ids=torch.zeros(txt, 3),
        return_dict=False,
    )


def _flux2_inputs(cfg, g, batch, img, txt):
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        guidance=torch.full((batch,), 3.5),
        img_ids=torch.randint(0, 8, (batch, img, 4), generator=g).float(),
        txt_ids=torch.zeros(batch, txt, 4),
        return_dict=False,
    )


def _qwen_inputs(cfg, g, batch, img, txt):
    side = int(img**0.5)
    assert side * side == img, "Qwen-Image tiny inputs need a square number of image tokens"
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        encoder_hidden_states_mask=torch.ones(batch, txt, dtype=torch.long),
        timestep=torch.rand(batch, generator=g),
        img_shapes=[[(1, side, side)]] * batch,
        return_dict=False,
    )


def _zimage_inputs(cfg, g, batch, img, txt):
    side = int(img**0.5) * 2  # patch size 2: img tokens = (side / 2) ** 2
    return dict(
        x=[torch.randn(cfg["in_channels"], 1, side, side, generator=g) for _ in range(batch)],
        t=torch.rand(batch, generator=g),
        cap_feats=[torch.randn(txt, cfg["cap_feat_dim"], generator=g) for _ in range(batch)],
        return_dict=False,
    )


# Issue 10 coverage. Prompts are batch-padded where the model takes a text mask: sample 1 has its last
# quarter of text tokens masked out, so the sharded and reference runs both see a padded prompt.
def _mask(batch, txt):
    """[batch, txt] ones, the second sample right-padded by a quarter (a padded prompt)."""
    mask = torch.ones(batch, txt, dtype=torch.long)
    if batch > 1:
        mask[1, txt - max(1, txt // 4) :] = 0
    return mask


def _side(img, patch=1):
    side = int(img**0.5)
    assert side * side == img, f"{img} image tokens is not a square"
    return side * patch


def _pixart_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        added_cond_kwargs={"resolution": None, "aspect_ratio": None},
        encoder_attention_mask=_mask(batch, txt),
        return_dict=False,
    )


def _sd3_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        pooled_projections=torch.randn(batch, cfg["pooled_projection_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        return_dict=False,
    )


def _auraflow_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        return_dict=False,
    )


def _cogview4_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    size = torch.tensor([[s * 8, s * 8]] * batch, dtype=torch.float32)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        original_size=size,
        target_size=size,
        crop_coords=torch.zeros(batch, 2),
        return_dict=False,
    )


def _cogvideox_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    frames = (cfg["sample_frames"] - 1) // cfg.get("temporal_compression_ratio", 4) + 1
    return dict(
        hidden_states=torch.randn(batch, frames, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, cfg["max_text_seq_length"], cfg["text_embed_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        return_dict=False,
    )


def _chroma_inputs(cfg, g, batch, img, txt):
    mask = torch.cat([_mask(batch, txt), torch.ones(batch, img, dtype=torch.long)], dim=1).bool()
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        img_ids=torch.randint(0, 8, (img, 3), generator=g).float(),
        txt_ids=torch.zeros(txt, 3),
        attention_mask=mask,
        return_dict=False,
    )


def _hunyuan_video_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], 1, s, s, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        encoder_attention_mask=_mask(batch, txt),
        pooled_projections=torch.randn(batch, cfg["pooled_projection_dim"], generator=g),
        guidance=torch.full((batch,), 3500.0),
        return_dict=False,
    )


def _hunyuan_image_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"][0])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g).float(),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        encoder_attention_mask=_mask(batch, txt),
        return_dict=False,
    )


def _lumina2_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        timestep=torch.rand(batch, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["cap_feat_dim"], generator=g),
        encoder_attention_mask=_mask(batch, txt).bool(),
        return_dict=False,
    )


def _sana_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_attention_mask=_mask(batch, txt),
        return_dict=False,
    )


def _video_grid(img):
    """(frames, height, width) in tokens for `img` tokens: 2 frames of 2 x img/4 (a multiple of 4)."""
    assert img % 4 == 0, f"{img} video tokens must be a multiple of 4 (2 frames x 2 rows)"
    return 2, 2, img // 4


def _wan_inputs(cfg, g, batch, img, txt):
    pt, ph, pw = cfg["patch_size"]
    f, h, w = _video_grid(img)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f * pt, h * ph, w * pw, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_dim"], generator=g),
        return_dict=False,
    )


def _ltx_inputs(cfg, g, batch, img, txt):
    f, h, w = _video_grid(img)
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_attention_mask=_mask(batch, txt),
        num_frames=f,
        height=h,
        width=w,
        return_dict=False,
    )


def _mochi_inputs(cfg, g, batch, img, txt):
    f, h, w = _video_grid(img)
    p = cfg["patch_size"]
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f, h * p, w * p, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_attention_mask=_mask(batch, txt),
        return_dict=False,
    )


def _cosmos_inputs(cfg, g, batch, img, txt):
    f, h, w = _video_grid(img)
    pt, ph, pw = cfg["patch_size"]
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f * pt, h * ph, w * pw, generator=g),
        timestep=torch.rand(batch, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        return_dict=False,
    )


def _hidream_inputs(cfg, g, batch, img, txt):
    s = _side(img, cfg["patch_size"])
    t5, llama = cfg["caption_channels"]
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        timesteps=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states_t5=torch.randn(batch, txt, t5, generator=g),
        encoder_hidden_states_llama3=torch.randn(len(cfg["llama_layers"]), batch, txt, llama, generator=g),
        pooled_embeds=torch.randn(batch, cfg["text_emb_dim"], generator=g),
        return_dict=False,
    )


def _qwen21_inputs(cfg, g, batch, img, txt):
    side = _side(img)
    slots = img // 4
    img_mask = torch.cat([torch.zeros(batch, txt, dtype=torch.bool), torch.ones(batch, slots, dtype=torch.bool)], 1)
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["context_in_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        img_shapes=[[(1, side, side)]] * batch,
        img_mask=img_mask,
        encoder_hidden_states_mask=_mask(batch, txt).bool(),
        return_dict=False,
    )


INPUT_BUILDERS = {
    "FluxTransformer2DModel": _flux_inputs,
    "Flux2Transformer2DModel": _flux2_inputs,
    "QwenImageTransformer2DModel": _qwen_inputs,
    "ZImageTransformer2DModel": _zimage_inputs,
    "PixArtTransformer2DModel": _pixart_inputs,
    "SD3Transformer2DModel": _sd3_inputs,
    "AuraFlowTransformer2DModel": _auraflow_inputs,
    "CogView4Transformer2DModel": _cogview4_inputs,
    "CogVideoXTransformer3DModel": _cogvideox_inputs,
    "ChromaTransformer2DModel": _chroma_inputs,
    "HunyuanVideoTransformer3DModel": _hunyuan_video_inputs,
    "HunyuanImageTransformer2DModel": _hunyuan_image_inputs,
    "Lumina2Transformer2DModel": _lumina2_inputs,
    "SanaTransformer2DModel": _sana_inputs,
    "WanTransformer3DModel": _wan_inputs,
    "SkyReelsV2Transformer3DModel": _wan_inputs,
    "LTXVideoTransformer3DModel": _ltx_inputs,
    "MochiTransformer3DModel": _mochi_inputs,
    "CosmosTransformer3DModel": _cosmos_inputs,
    "HiDreamImageTransformer2DModel": _hidream_inputs,
    "QwenImage21Transformer2DModel": _qwen21_inputs,
}


def _flow_inputs(class_name: str, config: dict) -> dict:
    """`example_inputs` for the meta forward `prepare` runs (resolve/flow.py); guidance when the model embeds it."""
    kwargs = example_inputs(class_name, config)
    if config.get("guidance_embeds") and "guidance" not in kwargs:
        kwargs["guidance"] = torch.full((1,), 3.5)
    return kwargs


for _name in INPUT_BUILDERS:
    register_example_inputs(_name, lambda config, name=_name: _flow_inputs(name, config))
