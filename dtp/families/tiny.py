"""Tiny random-weight instances of the families, with matching inputs.

Real diffusers classes at small widths (each family's `TINY` config), so a forward runs in milliseconds on
CPU while keeping every structural feature: `dtp lint`, `suggest` and `verify` trace them, and so do the
tests and the demo.
"""

from __future__ import annotations

import torch

from . import FAMILIES, example_inputs, model_class


def tiny_model(class_name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny instance with weights drawn from `seed` (identical on every rank), in eval mode."""
    return random_model(class_name, {**FAMILIES[class_name].tiny, **overrides}, seed)


def random_model(class_name: str, config: dict, seed: int = 0) -> torch.nn.Module:
    """`class_name` built from `config` with every parameter drawn from N(0, 0.2), in eval mode.

    diffusers zero-initializes some output layers; random values make a wrong shard visible.
    """
    torch.manual_seed(seed)
    model = model_class(class_name).from_config(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    return model.eval()


PERTURB_STD = 0.05  # small next to the N(0, 0.2) weights of the DiTs: keeps the encoders' activations tame


@torch.no_grad()
def perturb(module: torch.nn.Module, seed: int, std: float = PERTURB_STD) -> torch.nn.Module:
    """Add N(0, std) noise drawn from `seed` to every floating parameter of `module` (tied ones once), in place.

    transformers and diffusers initialize biases to zero and norm weights to one; a slicing bug on such a tensor
    (a bias split the wrong way, a norm weight replicated where it should be sharded) compares zeros with zeros
    and cannot show. The tiny pipelines (`pipelines.py`) and the test fixtures (`dtp.testing`) move every
    component off its initial values with this."""
    generator = torch.Generator().manual_seed(seed)
    for param in module.parameters():
        if param.is_floating_point():
            param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * std)
    return module


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
    cfg = FAMILIES[class_name].tiny if config is None else config
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
