"""Known diffusers DiT classes by name, and forward inputs for them shaped by any config.

Used by `dtp check` (full-size shapes on the meta device), the tools that run a model on made-up
inputs, and the tiny test fixtures (`testing/tiny.py`), which feed the same builders a tiny config.
"""

from __future__ import annotations

import torch

from .errors import PlanError


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


INPUT_BUILDERS = {
    "FluxTransformer2DModel": _flux_inputs,
    "Flux2Transformer2DModel": _flux2_inputs,
    "QwenImageTransformer2DModel": _qwen_inputs,
    "ZImageTransformer2DModel": _zimage_inputs,
}
