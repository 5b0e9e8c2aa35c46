"""The tensors a sharded forward holds whole at its peak: why a per-rank peak is above one rank's / (cp x tp).

A cp plan cuts the sequence at a module boundary; what the model's forward builds for the whole sequence before that
boundary (Helios' per-token modulation before its plan's `cp.forward`, Wan Animate's embedded video)
lives on every rank, undivided, and so does what a plan gathers on purpose (a gathered region). `PeakTensors`
records, during `trace.PhaseTrace`, what each live tensor is (shape, dtype, the op and the module that made it) and
which were alive at the peak; `whole_at_peak` compares the sharded trace with one rank's:

    whole tensor    alive at the sharded peak, and a tensor of the same shape and dtype was made by one rank's
                    forward too: not divided by cp x tp (a divided one has 1/cp of its sequence axis); or the same
                    but for one dim of m > cp rows made the next multiple of cp: the whole sequence zero-padded
                    for the cp cut (`padded`; ConsisID's video [1, 17552, 3072] of 17550 tokens used to be one)
    above ideal     its bytes x (1 - 1 / (cp tp)): what it adds to the rank's peak beyond its ideal share
    region's cost   the sum over the whole tensors; ratio without it = (per rank - cost) / ideal

`dtp check` prints them beside the ratio (`tools/check.py::format_peak`), so a ratio above 1.25 says which tensors
make it. Tensors under `FLOOR` of the per-rank peak are left out (per-sample embeddings, modulation vectors).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

FLOOR = 0.01  # of the per-rank peak: smaller whole tensors are not listed
LISTED = 8  # the largest whole tensors the report names


@dataclass(frozen=True)
class Made:
    """One storage made during a traced forward."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    op: str
    module: str
    """The innermost module running when it was made ("" at the model's own forward)."""

    @property
    def key(self) -> tuple:
        return self.shape, self.dtype


class PeakTensors:
    """What each live storage of a traced forward is, and the set of them alive at the peak (module docstring)."""

    def __init__(self):
        self.live: dict[int, Made] = {}
        self.at_peak: tuple[Made, ...] = ()
        self.made: set[tuple] = set()
        self._stack: list[str] = []

    def add(self, key: int, nbytes: int, tensor: torch.Tensor, op: str) -> None:
        made = Made(nbytes, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), op, self.module)
        self.live[key] = made
        self.made.add(made.key)

    def free(self, key: int) -> None:
        self.live.pop(key, None)

    def peak(self) -> None:
        """The live storages are the peak's (called at each new peak)."""
        self.at_peak = tuple(self.live.values())

    @property
    def module(self) -> str:
        return self._stack[-1] if self._stack else ""

    @contextlib.contextmanager
    def modules(self, model: nn.Module | None):
        """Keep the innermost running module of `model` (its path) while the forward runs."""
        if model is None:
            yield
            return
        names = {id(m): name for name, m in model.named_modules()}

        def enter(module, _args):
            self._stack.append(names.get(id(module), self.module))

        def leave(module, _args, _out):
            if self._stack:
                self._stack.pop()

        handles = [
            nn.modules.module.register_module_forward_pre_hook(enter),
            nn.modules.module.register_module_forward_hook(leave, always_call=True),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def whole_at_peak(sharded, one, *, cp: int, tp: int, per_rank: int, ideal: float) -> dict:
    """The whole tensors of `sharded` (a `Trace` at (cp, tp)) at its peak, judged against `one` (one rank's
    `Trace`): {"tensors": [...], "above_ideal_bytes", "ratio_without"} (module docstring)."""
    ranks = cp * tp
    floor = FLOOR * per_rank
    whole = [m for m in sharded.at_peak if m.nbytes >= floor and (m.key in one.made or padded(m.key, one.made, cp))]
    whole.sort(key=lambda m: -m.nbytes)
    above = sum(m.nbytes for m in whole) * (1 - 1 / ranks)
    rows = [
        {
            "tensor": f"{list(m.shape)} {m.dtype}",
            "made_by": f"{m.op} in {m.module or 'the forward itself'}",
            "bytes": m.nbytes,
            "above_ideal_bytes": int(m.nbytes * (1 - 1 / ranks)),
        }
        for m in whole[:LISTED]
    ]
    return {
        "tensors": rows,
        "count": len(whole),
        "above_ideal_bytes": int(above),
        "ratio_without": (per_rank - above) / ideal if ideal else 0.0,
    }


def padded(key: tuple, made, cp: int) -> bool:
    """Whether `key` (shape, dtype) is a shape of `made` with one dim of m > cp rows made n, the next multiple of cp:
    a whole sequence zero-padded for the cp cut (module docstring). [1, 17552, 3072] of [1, 17550, 3072] at cp = 8:
    True; [1, 6, D] of [1, 1, D] (a count, not a padded sequence): False."""
    shape, dtype = key
    for other, other_dtype in made:
        if other_dtype != dtype or len(other) != len(shape):
            continue
        longer = [(n, m) for n, m in zip(shape, other) if n != m]
        if len(longer) == 1 and longer[0][1] > cp and longer[0][0] == longer[0][1] + (-longer[0][1]) % cp:
            return True
    return False
