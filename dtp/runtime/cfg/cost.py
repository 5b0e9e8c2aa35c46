"""What the cfg axis exchanges, in one place for `dtp check` (per step, from one output) and `dtp fit` (per call).

One exchanged call, per rank, at cfg = c (`exchange`), as (op, result bytes, group size):

    all_gather   the shape header: c x MAX_HEADER int64                      over the cfg group
    all_gather   the outputs: `gathered` bytes (c x this rank's output)      over the cfg group
    pair path    + all_reduce x 2 of FLAGS int64 (one per call of the pair)  over the whole mesh

The step path (`steps.py`: P passes over c groups, one exchange per step) sends no header (its sizes are learned):

    all_gather   every pass's output: `gathered` bytes (P x one pass's output)   over the cfg group
    all_reduce   x (calls - 1) of 1 int64: each later call's hit, agreed          over the whole mesh

so a step's compute per rank is P / c passes (LTX-2 with its 4 passes: 2 at c = 2, 1 at c = 4).

`exchange_per_step` sums it per op for `dtp check`'s table, from one output of batch 1 (the noise prediction):

    two calls per step (pair):    all_reduce x 2 (2 int64 flags each); all_gather x 2 (header; c x out)
    doubled batch (batch 2):      all_gather x 2 (the header; the joined output, 2 x out)

Bytes are the size of each full result, as `dtp check` counts its other collectives. The compute per
rank halves at c = 2; the exchange is one noise prediction, small next to a forward's TP traffic.
"""

from __future__ import annotations

from .exchange import MAX_HEADER

INT64 = 8
FLAGS = 2  # int64 flags of the pair path's agreement all-reduce
PAIR_CALLS = 2  # a pair step's two calls, one agreement each


def exchange(path: str, cfg: int, gathered: int, world: int, calls: int = 1) -> list[tuple[str, int, int]]:
    """The collectives of one exchanged call on `path` ("pair" or "batch"), or of one step on "steps" (of `calls`
    transformer calls), as (op, result bytes, group size); `gathered`: bytes of the gathered outputs, `world`: ranks
    of the whole mesh."""
    assert path in ("pair", "batch", "steps"), path
    if path == "steps":
        return [("all_gather", gathered, cfg)] + [("all_reduce", INT64, world)] * (calls - 1)
    records = [("all_gather", cfg * MAX_HEADER * INT64, cfg), ("all_gather", gathered, cfg)]
    if path == "pair":
        records += [("all_reduce", FLAGS * INT64, world)] * PAIR_CALLS
    return records


def exchange_per_step(output_bytes: int, cfg: int) -> dict:
    """`{"pair": {op: {"count", "bytes"}}, "batch": {...}}`: the cfg collectives of one denoising step."""
    return {
        "pair": _by_op(exchange("pair", cfg, cfg * output_bytes, cfg)),
        "batch": _by_op(exchange("batch", cfg, 2 * output_bytes, cfg)),
    }


def step_passes_exchange(pass_bytes: int, passes: int, calls: int, cfg: int, world: int) -> list[tuple[str, int, int]]:
    """The step path's collectives of one step (`exchange("steps", ...)`) for `passes` passes of `pass_bytes` output
    each over `calls` calls: e.g. LTX-2 (4 passes, 3 calls) -> one all_gather of 4 outputs, 2 flag all-reduces."""
    assert passes % cfg == 0, f"cfg={cfg} does not divide {passes} passes"
    return exchange("steps", cfg, passes * pass_bytes, world, calls=calls)


def _by_op(records: list[tuple[str, int, int]]) -> dict:
    by_op: dict = {}
    for op, nbytes, _ in sorted(records, key=lambda r: r[0] != "all_reduce"):  # the table lists the flags first
        entry = by_op.setdefault(op, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += nbytes
    return by_op
