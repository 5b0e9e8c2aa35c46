"""Tiny random-weight configs of the bundled architectures, with matching inputs.

Used by the demo, the tests and the benchmarks: real diffusers classes, small widths, so a forward
runs in milliseconds on CPU while keeping every structural feature (both block kinds, packed
projections, refiners). Head counts and widths allow tp = 1, 2, 4 unless overridden.
"""

from __future__ import annotations

import torch

from ..families import FAMILIES, example_inputs, model_class

# The tiny configs live with their families (`dtp/families/`): one home per architecture.
TINY_CONFIGS = {name: f.tiny for name, f in FAMILIES.items()}


def plan_classes() -> dict[str, str]:
    """Bundled plan name -> the class it is written for (each family names its plan)."""
    return {f.plan: name for name, f in FAMILIES.items()}


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
