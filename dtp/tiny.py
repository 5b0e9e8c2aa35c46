"""Tiny random-weight configs of the bundled architectures, with matching inputs.

Used by the demo, the tests and the benchmarks: real diffusers classes, small widths, so a forward
runs in milliseconds on CPU while keeping every structural feature (both block kinds, packed
projections, refiners). Head counts and widths allow tp = 1, 2, 4 unless overridden.
"""

from __future__ import annotations

import torch

TINY_CONFIGS = {
    "FluxTransformer2DModel": dict(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=False,
        axes_dims_rope=(4, 6, 6),
    ),
    "Flux2Transformer2DModel": dict(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=32, timestep_guidance_channels=32, mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4), guidance_embeds=True,
    ),
    "QwenImageTransformer2DModel": dict(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=32, axes_dims_rope=(4, 6, 6),
    ),
    "ZImageTransformer2DModel": dict(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=96, n_layers=2, n_refiner_layers=1,
        n_heads=4, n_kv_heads=4, cap_feat_dim=32, axes_dims=[8, 8, 8], axes_lens=[64, 32, 32],
    ),
}

# bundled plan name -> diffusers class name
PLAN_CLASSES = {
    "flux": "FluxTransformer2DModel",
    "flux2": "Flux2Transformer2DModel",
    "qwenimage": "QwenImageTransformer2DModel",
    "zimage": "ZImageTransformer2DModel",
}


def model_class(class_name: str):
    import diffusers

    return getattr(diffusers, class_name)


def tiny_model(class_name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny instance with weights drawn from `seed` (identical on every rank), in eval mode."""
    torch.manual_seed(seed)
    model = model_class(class_name)(**{**TINY_CONFIGS[class_name], **overrides})
    # diffusers zero-initializes some output layers; random values make a wrong shard visible.
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    return model.eval()


def tiny_inputs(
    class_name: str, seed: int = 1, batch: int = 1, img_tokens: int = 16, txt_tokens: int = 8, config: dict | None = None
) -> dict:
    """Keyword arguments for one forward of the tiny model (same on every rank for a fixed seed).

    `config` (default: the tiny one) sets the widths, so full-size configs get full-size shapes.
    """
    g = torch.Generator().manual_seed(seed)
    cfg = TINY_CONFIGS[class_name] if config is None else config
    return _INPUTS[class_name](cfg, g, batch, img_tokens, txt_tokens)


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


_INPUTS = {
    "FluxTransformer2DModel": _flux_inputs,
    "Flux2Transformer2DModel": _flux2_inputs,
    "QwenImageTransformer2DModel": _qwen_inputs,
    "ZImageTransformer2DModel": _zimage_inputs,
}


def output_tensor(output) -> torch.Tensor:
    """The sample tensor of a diffusers model output (tuple, list of per-image tensors, or tensor)."""
    out = output[0] if isinstance(output, (tuple, list)) else output
    if isinstance(out, (list, tuple)):
        out = torch.stack([o.float() for o in out])
    return out
