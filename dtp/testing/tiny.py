"""Tiny random-weight configs of the bundled architectures, with matching inputs.

Used by the demo, the tests and the benchmarks: real diffusers classes, small widths, so a forward
runs in milliseconds on CPU while keeping every structural feature (both block kinds, packed
projections, refiners). Head counts and widths allow tp = 1, 2, 4 unless overridden.
"""

from __future__ import annotations

from ..families import FAMILIES, model_class
from ..families.tiny import output_tensor, tiny_inputs, tiny_model

# The tiny configs live with their families (`dtp/families/`): one home per architecture.
TINY_CONFIGS = {name: f.tiny for name, f in FAMILIES.items()}


def plan_classes() -> dict[str, str]:
    """Bundled plan name -> the class it is written for (each family names its plan)."""
    return {f.plan: name for name, f in FAMILIES.items()}


PLAN_CLASSES = plan_classes()


__all__ = ["PLAN_CLASSES", "TINY_CONFIGS", "model_class", "output_tensor", "plan_classes", "tiny_inputs", "tiny_model"]
