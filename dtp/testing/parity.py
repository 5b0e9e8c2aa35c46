"""Numeric parity: a sharded forward against the same model on one device.

A wrong plan usually still runs and gives plausible numbers, so the only real test of a plan is
the comparison. Run inside an initialized process group (every rank computes the reference too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..parallelize import parallelize
from .tiny import output_tensor


@dataclass(frozen=True)
class Parity:
    max_abs_diff: float  # max |sharded - ref|
    max_abs_ref: float  # max |ref|

    @property
    def relative(self) -> float:
        return self.max_abs_diff / max(self.max_abs_ref, 1e-30)


@torch.no_grad()
def forward_parity(make_model, inputs: dict, mesh, plan=None, **options) -> Parity:
    """Build two identical models with `make_model()`, shard one with `plan` (and `parallelize`'s
    keyword `options`, e.g. pad=True), compare one forward."""
    ref = output_tensor(make_model()(**inputs)).float()
    sharded_model = parallelize(make_model(), mesh, plan, **options)
    out = output_tensor(sharded_model(**inputs)).float()
    return Parity(float((out - ref).abs().max()), float(ref.abs().max()))
