"""What the cfg axis exchanges per denoising step, from the size of one transformer output (for `dtp check`).

Per rank, at cfg = c, with `out` the bytes of one output of batch 1 (the noise prediction):

    two calls per step (pair):    all_reduce x 2 (2 int64 flags, one per call)
                                  all_gather x 2 (a header of MAX_HEADER int64; the output, c x out)
    doubled batch (batch 2):      all_gather x 2 (the header; the joined output, 2 x out)

Bytes are the size of each full result, as `dtp check` counts its other collectives. The compute per
rank halves at c = 2; the exchange is one noise prediction, small next to a forward's TP traffic.
"""

from __future__ import annotations

from .exchange import MAX_HEADER

INT64 = 8


def exchange_per_step(output_bytes: int, cfg: int) -> dict:
    """`{"pair": {op: {"count", "bytes"}}, "batch": {...}}`: the cfg collectives of one denoising step."""
    header = cfg * MAX_HEADER * INT64
    return {
        "pair": {
            "all_reduce": {"count": 2, "bytes": 2 * 2 * INT64},
            "all_gather": {"count": 2, "bytes": header + cfg * output_bytes},
        },
        "batch": {"all_gather": {"count": 2, "bytes": header + 2 * output_bytes}},
    }
