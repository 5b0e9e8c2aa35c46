"""Check a model folder against its class with the shard-on-load checks, for a loader that is not dtp's.

`dtp run` without torchrun hands the whole pipeline to diffusers, whose errors for a damaged checkpoint
are tracebacks from deep inside it (an `OSError` for a truncated file, a `ValueError` for a wrong shape).
Running the checks `from_pretrained` runs first gives the same `CheckpointError` messages as the
sharded path, before diffusers reads anything: the headers of every file (no tensor byte), then every
key and shape against the model's skeleton (parameters on meta).
"""

from __future__ import annotations

import torch

from ..plan.transformers import is_transformers_model
from .keys import model_keymap
from .load import build_skeleton, open_model_checkpoint


def check_files(model_class, directory: str, torch_dtype: torch.dtype | None = None) -> None:
    """Raise the `CheckpointError` that `from_pretrained(model_class, directory)` would raise for these files
    (no config.json, no safetensors, a missing shard, a corrupt or truncated file, missing, unexpected or
    wrongly shaped keys); return None when they would load. Reads headers only."""
    model = build_skeleton(model_class, directory, torch_dtype)
    transformers_model = is_transformers_model(model)
    model_keymap(model, open_model_checkpoint(directory, transformers_model), transformers_model)
