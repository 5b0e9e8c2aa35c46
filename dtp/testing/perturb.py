"""Fixture models moved off their initial values, so that no slice of any parameter is trivially zero or one.

transformers and diffusers initialize biases to zero and norm weights to one; a slicing bug on such a
tensor (a bias split the wrong way, a norm weight replicated where it should be sharded) compares zeros
with zeros and cannot show. Every fixture adds seeded noise to every parameter after its own init.
"""

from __future__ import annotations

import torch

STD = 0.05  # small next to the N(0, 0.2) weights of the DiT fixtures: keeps the encoders' activations tame


@torch.no_grad()
def perturb(module: torch.nn.Module, seed: int, std: float = STD) -> torch.nn.Module:
    """Add N(0, std) noise drawn from `seed` to every floating parameter of `module` (tied ones once), in place."""
    generator = torch.Generator().manual_seed(seed)
    for param in module.parameters():
        if param.is_floating_point():
            param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * std)
    return module


def trivial_parameters(module: torch.nn.Module) -> list[str]:
    """The names of `module`'s parameters holding an element exactly 0 or exactly 1 (none, after `perturb`)."""
    return [name for name, p in module.named_parameters() if bool(((p == 0) | (p == 1)).any())]
