"""One-process references through diffusers' own code only (no dtp on the path): what the end-to-end tests
compare a sharded `dtp run` / `dtp demo` with, so a bug shared by dtp's two paths cannot cancel out."""

from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def diffusers_pixels(
    model_dir, prompt: str, *, steps: int, height: int, width: int, seed: int, lora=None, lora_scale: float = 1.0
) -> np.ndarray:
    """fp32 pixels [H, W, 3] in [0, 1] from `DiffusionPipeline.from_pretrained(model_dir)`, with the LoRA file
    `lora` loaded by diffusers' `load_lora_weights` and weighted by `set_adapters(..., adapter_weights=...)`."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(str(lora), adapter_name="reference")
        pipe.set_adapters(["reference"], adapter_weights=[lora_scale])
    out = pipe(
        prompt=prompt,
        num_inference_steps=steps,
        height=height,
        width=width,
        generator=torch.Generator("cpu").manual_seed(seed),
        output_type="np",
    )
    return out.images[0]
