"""Tiny random-weight configs of the bundled architectures, with matching inputs.

Used by the demo, the tests and the benchmarks: real diffusers classes, small widths, so a forward
runs in milliseconds on CPU while keeping every structural feature (both block kinds, packed
projections, refiners). Head counts and widths allow tp = 1, 2, 4 unless overridden.
"""

from __future__ import annotations

import torch

from ..models import example_inputs, model_class
from ..plan import bundled_plan_names, load_plan

TINY_CONFIGS = {
    "FluxTransformer2DModel": dict(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(4, 6, 6),
    ),
    "Flux2Transformer2DModel": dict(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        timestep_guidance_channels=32,
        mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=True,
    ),
    "QwenImageTransformer2DModel": dict(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
    ),
    "ZImageTransformer2DModel": dict(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=4,
        dim=96,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=4,
        n_kv_heads=4,
        cap_feat_dim=32,
        axes_dims=[8, 8, 8],
        axes_lens=[64, 32, 32],
    ),
}


def plan_classes() -> dict[str, str]:
    """Bundled plan name -> the tiny-config class it is written for (read from the plans' `models:`)."""
    found = {}
    for name in bundled_plan_names():
        classes = [c for c in load_plan(name).models if c in TINY_CONFIGS]
        if classes:
            found[name] = classes[0]
    return found


PLAN_CLASSES = plan_classes()


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
    class_name: str,
    seed: int = 1,
    batch: int = 1,
    img_tokens: int = 16,
    txt_tokens: int = 8,
    config: dict | None = None,
) -> dict:
    """Keyword arguments for one forward of the tiny model (same on every rank for a fixed seed).

    `config` (default: the tiny one) sets the widths, so full-size configs get full-size shapes.
    """
    cfg = TINY_CONFIGS[class_name] if config is None else config
    return example_inputs(class_name, cfg, seed=seed, batch=batch, img_tokens=img_tokens, txt_tokens=txt_tokens)


def output_tensor(output) -> torch.Tensor:
    """The sample of a diffusers model output as one fp32 tensor.

    A tuple's first element, or the tensor itself; a list of per-image tensors (Z-Image) is stacked
    when the images have one shape, else flattened and concatenated (images of different sizes).
    """
    out = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(out, (list, tuple)):
        return out.float()
    if len({tuple(o.shape) for o in out}) == 1:
        return torch.stack([o.float() for o in out])
    return torch.cat([o.float().flatten() for o in out])
