"""Self-attention over row strips, exact: local queries, keys and values of the whole image.

softmax(q_i K^T / sqrt(d)) V for this rank's query rows i needs every key and value (the mid-block
attends over all positions), so the outputs of `to_k` and `to_v` are gathered along the sequence
(rank order = row-major order of the image; the order would not even matter, as long as keys and
values agree). Queries, the output projection and the residual stay local: each rank computes its
own rows of the untiled attention. Memory: K and V of the whole image at the coarsest resolution,
the score matrix only for local queries (1/N of it).
"""

from __future__ import annotations

import torch

from .halo import gather_rows
from .split import Split


class SequenceGather:
    """Forward hooks for an Attention module: record the strip's (rows, width), gather K and V over ranks."""

    def __init__(self, split: Split):
        self.split = split
        self.rows = None
        self.width = None

    def record(self, module, args, kwargs):
        """Forward pre-hook on the Attention module: the input is (B, C, h, W), this rank's strip."""
        hidden = args[0] if args else kwargs["hidden_states"]
        self.rows, self.width = hidden.shape[2], hidden.shape[3]

    def gather(self, module, args, output: torch.Tensor) -> torch.Tensor:
        """Forward hook on to_k / to_v: (B, h * W, D) -> (B, H * W, D), every rank's tokens in rank order."""
        counts = tuple(c * self.width for c in self.split.counts(self.rows))
        return gather_rows(output, 1, counts, self.split.group)
