"""Slices by a global token count after the blocks: each rank keeps its own tokens (`cp.keep`, `plan.cp.KeepRule`).

Some forwards cut the sequence outside any module, with a count of the whole sequence: FramePack keeps the last
n = frames x rows x cols tokens of [4x, 2x, clean history, noisy] (`hidden_states[:, -n:]`), ConsisID drops the
first T = prompt tokens of `cat([text, video])`. On a rank's chunk those slices keep the wrong rows. Each rank
knows its global token range from the split that cut it (`PadState.lengths`: rows a rank c, whole rows), so a
pre-hook on the next module rewrites the sliced tensor into the rank's share:

- `last`: rank r holds global rows [r c, (r + 1) c) of S = c cp; the forward keeps [S - n, S). The rank keeps
  `kept_range(r, c, S, n)` of them (the forward's own `[:, -n:]` on the chunk left them). Example:
  S = 34 (18 history + 16 noisy), cp = 2, c = 17, n = 16: rank 0 (rows 0..16, all history) keeps 0 rows, rank 1
  (rows 17..33: one history row, then the 16 noisy ones) keeps its last 16. The ragged chunks go
  through the per-token tail (norm, projection) and `GatherKept` all-gathers them (each padded to c rows; only the
  projected output travels, 64 channels for FramePack) and drops the padding.
- `after`: the input is [the `after` split's chunk, the `of` chunk]; it becomes [T zero rows, the `of` chunk], T the
  `after` split's whole unpadded length, so the forward's `[:, T:]` leaves the `of` chunk (a plain `gather` after).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ...errors import ForwardError
from ...plan.cp import KeepRule
from ..arguments import Binder
from .hooks import PadState
from .sequence import dense


def kept_range(rank: int, rows: int, total: int, kept: int) -> tuple[int, int]:
    """`(begin, end)`: the rows of rank `rank`'s chunk (global rows [rank rows, (rank + 1) rows) of a sequence of
    `total` real rows, padded at its end to rows x cp) that fall in its last `kept` real rows; empty when none.
    rows = 17, total = 34, kept = 16: rank 0 -> (17, 17), rank 1 -> (1, 17); total = 33 (one pad row): (2, 16)."""
    start, end = max(total - kept, rank * rows), min((rank + 1) * rows, total)
    return (start - rank * rows, end - rank * rows) if end > start else (rows, rows)


class KeepState:
    """This forward's `last` keep: the rows each rank kept, for the gather that follows; and the recorded lengths of
    the modules whose outputs count the kept tokens."""

    def __init__(self):
        self.kept: list[int] | None = None
        self.counts: dict[str, int] = {}

    def reset(self, *unused) -> None:
        self.kept, self.counts = None, {}


class CountTokens:
    """Forward hook: record the length (dim 1) of the module's output, the global count a `last` keep reads."""

    def __init__(self, path: str, state: KeepState):
        self.path, self.state = path, state

    def __call__(self, module, args, output):
        tensor = output if isinstance(output, torch.Tensor) else output[0]
        self.state.counts[self.path] = tensor.shape[1]


class KeepTokens:
    """Pre-hook: rewrite input `rule.name` (dim 1 is the sequence) into this rank's share (module docstring)."""

    def __init__(self, path: str, module: nn.Module, rule: KeepRule, rank: int, cp: int, pads: PadState, state):
        self.path, self.rule, self.rank, self.cp, self.pads, self.state = path, rule, rank, cp, pads, state
        # the input by its position in the signature, found once: no `Signature.bind` per call, which dynamo cannot
        # trace (a graph break under torch.compile(fullgraph=True)), as the split hooks do
        self.binder = Binder(module.forward)

    def __call__(self, module, args, kwargs):
        """Pre-hook on the module's input `rule.name`."""
        return self.binder.map_argument(args, kwargs, self.rule.name, self._keep)

    def output(self, module, args, output):
        """Forward hook on the module's output element `rule.name` (0 for a bare tensor)."""
        if isinstance(output, torch.Tensor):
            return self._keep(output)
        items = list(output)
        items[self.rule.name] = self._keep(items[self.rule.name])
        return type(output)(items)

    def _keep(self, x) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise ForwardError(f"cp keep at '{self.path}': '{self.rule.name}' is not a tensor.")
        rows, total = self._length(self.rule.of)
        return self._last(x, rows, total) if self.rule.last is not None else self._after(x, rows)

    def _length(self, split: str) -> tuple[int, int]:
        if split not in self.pads.lengths:
            raise ForwardError(f"cp keep at '{self.path}': the split '{split}' did not run in this forward.")
        return self.pads.lengths[split]

    def _last(self, x: torch.Tensor, rows: int, total: int) -> torch.Tensor:
        if self.rule.last not in self.state.counts:
            raise ForwardError(f"cp keep at '{self.path}': '{self.rule.last}' did not run in this forward.")
        count = self.state.counts[self.rule.last]
        ranges = [kept_range(r, rows, total, count) for r in range(self.cp)]
        self.state.kept = [end - begin for begin, end in ranges]
        begin, end = ranges[self.rank]
        skipped = rows - x.shape[1]  # the forward's own `[:, -count:]` dropped this many leading rows of the chunk
        if sum(self.state.kept) != count or begin < skipped:
            raise ForwardError(
                f"cp keep at '{self.path}': the forward keeps the last {count} of {total} tokens; this rank holds rows "
                f"[{begin}, {end}) of them in its {rows}-row chunk of '{self.rule.of}', but gets {x.shape[1]} rows "
                f"(the pad rows at the sequence's end shifted the forward's slice); use fewer cp ranks or a length "
                f"that cp divides."
            )
        return x[:, begin - skipped : end - skipped]

    def _after(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        local, whole = self._length(self.rule.after)
        if x.shape[1] != local + rows:
            raise ForwardError(
                f"cp keep at '{self.path}': expected the rank's {local} '{self.rule.after}' rows then {rows} "
                f"'{self.rule.of}' rows, got {x.shape[1]}."
            )
        return torch.cat([x.new_zeros(x.shape[0], whole, *x.shape[2:]), x[:, local:]], dim=1)


class GatherKept:
    """Forward hook: all-gather the ragged kept chunks (dim 1) in rank order: each padded to the longest, the
    padding dropped after."""

    def __init__(self, path: str, group, state: KeepState):
        self.path, self.group, self.state = path, group, state

    def __call__(self, module, args, output):
        if not isinstance(output, torch.Tensor) or self.state.kept is None:
            raise ForwardError(f"cp gather at '{self.path}': expected a tensor after a `keep` of this forward.")
        kept, longest = self.state.kept, max(self.state.kept)
        pad = output.new_zeros(output.shape[0], longest - output.shape[1], *output.shape[2:])
        chunk = dense(torch.cat([output, pad], dim=1))
        chunks = [torch.empty_like(chunk) for _ in kept]
        dist.all_gather(chunks, chunk, group=self.group)
        return torch.cat([c[:, :n] for c, n in zip(chunks, kept)], dim=1)


def install_keeps(model: nn.Module, keeps, pads: PadState, group, rank: int, cp: int) -> list:
    """Hook every `(path, KeepRule)`: the counting modules, the keep pre-hooks and their gathers; returns handles."""
    if not keeps:
        return []
    state = KeepState()
    handles = [model.register_forward_pre_hook(state.reset)]
    for path, rule in keeps:
        if rule.last is not None:
            handles.append(model.get_submodule(rule.last).register_forward_hook(CountTokens(rule.last, state)))
        module = model.get_submodule(path)
        hook = KeepTokens(path, module, rule, rank, cp, pads, state)
        if isinstance(rule.name, int):
            handles.append(module.register_forward_hook(hook.output))
        else:
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        if rule.gather is not None:
            gather = GatherKept(rule.gather, group, state)
            handles.append(model.get_submodule(rule.gather).register_forward_hook(gather))
    return handles
