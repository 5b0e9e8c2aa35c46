"""Two generations' pixels compared: the demo's verdict, and the bound the pipeline tests share."""

from __future__ import annotations

import numpy as np

# Pixels in [0, 1], fp32: vllm-omni's TP test accepts 3e-2 / 2.5e-1; fp32 CPU runs differ by ~1e-7.
MEAN_TOLERANCE = 1e-3
P99_TOLERANCE = 1e-2


def compare(pixels: np.ndarray, reference: np.ndarray) -> tuple[float, float, bool]:
    """(mean |diff|, 99th percentile of |diff|, both within tolerance) of two [0, 1] images (or videos)."""
    if pixels.shape != reference.shape:
        raise ValueError(
            f"pixels of shape {pixels.shape} cannot be compared with a reference of shape {reference.shape}"
        )
    diff = np.abs(pixels - reference)
    mean, p99 = float(diff.mean()), float(np.quantile(diff, 0.99))
    return mean, p99, mean <= MEAN_TOLERANCE and p99 <= P99_TOLERANCE
