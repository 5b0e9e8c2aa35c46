"""Pixel errors of end-to-end tests: mean and max |diff| of two [0, 1] images, in float64.

The demo's verdict (mean 1e-3, p99 1e-2) is for people looking at pictures; fp32 pipelines of tiny models
agree with one process to ~1e-7, so the tests bound the mean at 1e-6 and the max at what they measure.
"""

from __future__ import annotations

import numpy as np

MEAN_BOUND = 1e-6  # every fp32 end-to-end test: measured 1e-8..2e-7


def pixel_error(pixels, reference) -> tuple[float, float]:
    """(mean |pixels - reference|, max |pixels - reference|) of two images of one shape."""
    a, b = np.asarray(pixels, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    diff = np.abs(a - b)
    return float(diff.mean()), float(diff.max())
