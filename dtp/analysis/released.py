"""Released pipelines at full size: the registry's components (`families/released_pipelines.py`) on the meta device.

`dtp check flux-pipeline --tp 8`, `dtp fit` and `benchmarks/pipeline_memory.py` build from them.
"""

from __future__ import annotations

import copy

import torch

from ..errors import PlanError
from ..families.released_pipelines import RELEASED_PIPELINES, Component, ReleasedPipeline
from .fakepg import meta_model

__all__ = ["RELEASED_PIPELINES", "build_component", "build_pipeline", "released_pipeline"]


def released_pipeline(name: str) -> ReleasedPipeline:
    """The released pipeline called `name`; PlanError naming the known ones otherwise."""
    if name not in RELEASED_PIPELINES:
        raise PlanError(f"no released pipeline named '{name}'; known pipelines: {', '.join(RELEASED_PIPELINES)}.")
    return RELEASED_PIPELINES[name]


def build_pipeline(pipeline: ReleasedPipeline, dtype: torch.dtype) -> dict[str, torch.nn.Module]:
    """Every component of `pipeline` on the meta device in `dtype`, by component name."""
    return {name: build_component(component, dtype) for name, component in pipeline.components.items()}


def build_component(component: Component, dtype: torch.dtype) -> torch.nn.Module:
    """One component on the meta device in `dtype`, in eval mode."""
    if component.config_class is None:
        config = None if component.config is None else dict(component.config)
        return meta_model(component.class_name, config, dtype=dtype)
    import transformers

    # A deep copy: transformers configs may rewrite nested dicts (rope_scaling) in place.
    config = getattr(transformers, component.config_class)(**copy.deepcopy(dict(component.config)))
    with torch.device("meta"):
        model = getattr(transformers, component.class_name)(config)
    return model.to(dtype).eval()
