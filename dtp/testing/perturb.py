"""Fixture models moved off their initial values, so that no slice of any parameter is trivially zero or one.

transformers and diffusers initialize biases to zero and norm weights to one; a slicing bug on such a
tensor (a bias split the wrong way, a norm weight replicated where it should be sharded) compares zeros
with zeros and cannot show. Every fixture adds seeded noise to every parameter after its own init
(`perturb`, whose home is `dtp.families.tiny`: the demo's tiny pipelines use it too, and product code
does not import this package).
"""

from __future__ import annotations

import torch

from ..families.tiny import PERTURB_STD as STD
from ..families.tiny import perturb

__all__ = ["STD", "perturb", "trivial_parameters"]


def trivial_parameters(module: torch.nn.Module) -> list[str]:
    """The names of `module`'s parameters holding an element exactly 0 or exactly 1 (none, after `perturb`)."""
    return [name for name, p in module.named_parameters() if bool(((p == 0) | (p == 1)).any())]
