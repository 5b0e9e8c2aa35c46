"""The cfg axis over every pass of a step: K groups, P passes (K divides P), one exchange per step.

A pass is one row of one transformer call. LTX-2 (diffusers 0.42.1) with classifier-free, spatio-temporal and
modality guidance makes three calls and four passes per step; K = 2 or 4 groups split them, group g taking the
passes [g P / K, (g + 1) P / K) in the order the pipeline makes them:

    call 0  "cond_uncond"      rows [uncond, cond]   pass 0, 1     cfg=2: group 0        cfg=4: groups 0, 1
    call 1  "uncond_stg"       row  [stg]            pass 2        cfg=2: group 1        cfg=4: group 2
    call 2  "uncond_modality"  row  [modality]       pass 3        cfg=2: group 1        cfg=4: group 3

The pipeline makes the calls one after the other and needs each output before it makes the next, so a group that
runs a later call runs it when the step's *first* call comes, on arguments predicted from it (`Cycle.predict`):

    learn  (one step through the per-call paths, `wrapper.py`): the calls of a step, from one call to the next call
           with the first one's signature (its context name, argument names, shapes, dtypes and other values), and
           where each argument of a later call comes from (`Source`): the first call's own value (FIRST), rows of
           one of its batched tensors (ROWS: LTX-2's STG call takes rows of the doubled batch's timestep, prompt
           embeddings, mask and coordinates, and the latents the doubled batch repeats), or the object the last
           step passed (HELD: the STG blocks, the context name). Compared by value, once.
    run    (the first call of each later step): every group runs its passes (the rows of a call given to it, as one
           call), the outputs of all passes go through ONE all_gather of a flat buffer (sizes known from the learned
           outputs: no header), each call's output is rebuilt from its rows, and the first call returns.
    answer (each later call): compared with its prediction as the pair path does (`tree`: identity and version,
           views of the same memory, one fused value read for the tensors nothing else can vouch for: LTX-2's
           latents, which the pipeline passes as `latents` to the STG and modality calls and as `cat([latents] * 2)`
           to the first); equal, the exchanged output, else the call runs in full (exact) and the step is learned
           anew. Every decision is agreed over the mesh on host groups (`host.py`).

With a cache on the path stands aside: the per-call paths keep every cache state's calls as one process makes them
(here a group would run whole a call whose rows the learning step split, its state seeing half a batch, then a
whole one). Refused: K not dividing the passes of a pipeline whose passes dtp knows (`passes.py`: a `PlanError` at
the first call, before the transformer runs).
A learned step K does not divide (an unknown pipeline) stays on the per-call paths: exact, without this speedup.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...errors import ForwardError
from .batch import split_arguments
from .tree import Held, hold, map_tensors, release, same_object, same_view

FIRST, ROWS, HELD = "first", "rows", "held"
MAX_CALLS = 8  # calls a learned step may have (a longer record is dropped: nothing repeats)
NOT_TAKEN = object()  # `Steps.answer`: the call goes to the per-call paths


@dataclass(frozen=True)
class Source:
    """Where an argument of a later call of the step comes from, given the step's first call."""

    kind: str  # FIRST: the first call's value; ROWS: its rows [start, stop) of `name`; HELD: the last step's object
    name: str = ""
    start: int = 0
    stop: int = 0


@dataclass(frozen=True)
class Leaf:
    """An output tensor as learned: its shape and dtype (dim 0 is the call's batch)."""

    shape: tuple
    dtype: torch.dtype


@dataclass
class Call:
    """One call of a step as seen: its arguments (the objects, not held: learning compares values), signature, batch
    and output tree (leaves as `Leaf`)."""

    arguments: dict
    signature: tuple
    batch: int
    output: object


@dataclass
class Cycle:
    """A learned step: its calls and where each later call's arguments come from."""

    calls: list[Call]
    sources: list[dict]  # per call: {argument name: Source}; the first call's is empty

    @property
    def batches(self) -> list[int]:
        return [call.batch for call in self.calls]

    @property
    def passes(self) -> int:
        return sum(self.batches)

    def rows(self) -> list[frozenset]:
        """Per call, the arguments predicted as rows of the first call's (only these may be trusted)."""
        return [frozenset(n for n, source in sources.items() if source.kind == ROWS) for sources in self.sources]

    def predict(self, first: dict) -> list[dict]:
        """The arguments of every call of the step whose first call has `first` (the first included, as given)."""
        cuts: dict = {}  # one view per (name, rows): calls that take the same rows get the same object

        def value(source: Source, i: int, name: str):
            if source.kind == FIRST:
                return first[source.name]
            if source.kind == ROWS:
                key = (source.name, source.start, source.stop)
                if key not in cuts:
                    cuts[key] = first[source.name][source.start : source.stop]
                return cuts[key]
            return release(self.calls[i].arguments[name])

        return [first] + [
            {name: value(source, i, name) for name, source in sources.items()}
            for i, sources in enumerate(self.sources)
            if i > 0
        ]


@dataclass
class StepStats:
    """`steps` steps run over the groups, `answered` later calls answered by the exchange, `missed` later calls that
    differed from their prediction (run in full), `dropped` predicted calls that never came."""

    steps: int = 0
    answered: int = 0
    missed: int = 0
    dropped: int = 0


def signature(value) -> object:
    """A hashable description of a call's arguments: tensors by shape, dtype and device, other leaves by value."""
    if isinstance(value, torch.Tensor):
        return (value.shape, value.dtype, value.device)
    if isinstance(value, dict):
        return tuple((k, signature(v)) for k, v in value.items())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(signature(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, id(value))
    return value


def leaf_tree(output) -> object:
    """`output` with each tensor replaced by its `Leaf`."""
    return map_tensors(output, lambda t: Leaf(tuple(t.shape), t.dtype))


def learn_sources(calls: list[Call]) -> list[dict]:
    """Where each later call's arguments come from (see the module docstring); compares values (once per cycle)."""
    first = release(calls[0].arguments)
    out = [{}]
    for call in calls[1:]:
        mine = release(call.arguments)
        out.append({name: _source(name, value, first, call.batch) for name, value in mine.items()})
    return out


def _source(name: str, value, first: dict, batch: int) -> Source:
    if name in first and _equal(value, first[name]):
        return Source(FIRST, name)
    if isinstance(value, torch.Tensor) and isinstance(first.get(name), torch.Tensor):
        rows = _rows_of(value, first[name], batch)
        if rows is not None:
            return Source(ROWS, name, rows, rows + batch)
    return Source(HELD, name)


def _equal(a, b) -> bool:
    from .tree import same

    return same(a, b)


def _rows_of(value: torch.Tensor, whole: torch.Tensor, batch: int) -> int | None:
    """The first row r with value == whole[r : r + batch] (a view of the same memory preferred), or None."""
    if whole.ndim == 0 or value.shape != (batch, *whole.shape[1:]) or whole.shape[0] <= batch:
        return None
    if value.dtype != whole.dtype or value.device != whole.device:
        return None
    starts = range(whole.shape[0] - batch + 1)
    from .tree import same_view

    for r in starts:
        if same_view(value, whole[r : r + batch]):
            return r
    for r in starts:
        if torch.equal(value, whole[r : r + batch]):
            return r
    return None


def assignment(batches: list[int], groups: int, group: int) -> list[tuple[int, int, int]]:
    """The passes of `group`: (call, first row, end row) of each call it runs rows of, in order.

    Passes are numbered over the calls in order (call i's rows follow call i - 1's); group g takes
    [g P / K, (g + 1) P / K). Batches 2, 1, 1 over 2 groups: group 0 [(0, 0, 2)], group 1 [(1, 0, 1), (2, 0, 1)];
    over 4 groups: [(0, 0, 1)], [(0, 1, 2)], [(1, 0, 1)], [(2, 0, 1)].
    """
    total = sum(batches)
    assert total % groups == 0, (batches, groups)
    lo, hi = group * total // groups, (group + 1) * total // groups
    out, at = [], 0
    for i, batch in enumerate(batches):
        start, stop = max(lo, at), min(hi, at + batch)
        if start < stop:
            out.append((i, start - at, stop - at))
        at += batch
    return out


def gather_flat(flat: torch.Tensor, sizes: list[int], group) -> list[torch.Tensor]:
    """Every group's flat buffer (`sizes[g]` elements each), in group order: one all_gather of the longest."""
    longest = max(sizes)
    if flat.numel() < longest:
        flat = torch.cat([flat, flat.new_zeros(longest - flat.numel())])
    gathered = [torch.empty_like(flat) for _ in sizes]
    dist.all_gather(gathered, flat, group=group)
    return [g[:n] for g, n in zip(gathered, sizes)]


@dataclass
class Steps:
    """The step path of one wrapper: the calls seen since the step began, the learned cycle, the pending answers."""

    groups: int
    group: int
    record: list[Call] = field(default_factory=list)
    cycle: Cycle | None = None
    start: tuple | None = None  # the signature of a step's first call, once a cycle was learned
    pending: list = field(default_factory=list)  # [(held prediction, output, ROWS names)] of the step's later calls
    checked: dict = field(default_factory=dict)  # tensors of this step's later calls already read equal (`verify`)
    ran: bool = False  # the step path ran: a cache's per-context states now differ between groups
    trusted: frozenset = frozenset()  # argument names compared on the device only (`passes.trusted_rows`)
    unverified: object = None  # a device bool: some trusted argument differed (`defer`, `check_deferred`)
    unverified_names: set = field(default_factory=set)  # the arguments `unverified` covers (host data)
    stats: StepStats = field(default_factory=StepStats)

    # ---- the per-call paths' calls: recorded until a step repeats ----

    def observe(self, arguments: dict, sig: tuple, output) -> None:
        """Record a call the per-call paths ran (a step in the making)."""
        if not self.record and self.start is not None and sig != self.start:
            return  # wait for a step's first call
        if len(self.record) >= MAX_CALLS:
            self.record = []
            return
        self.record.append(Call(dict(arguments), sig, _batch(arguments), leaf_tree(output)))  # learning reads values

    def qualifies(self, calls: list[Call]) -> bool:
        """Whether a recorded step runs on this path: more than one call and not two calls of one batch (the pair
        and batch paths' cases), K dividing its passes, every output a tensor of the call's batch rows, one dtype."""
        batches = [c.batch for c in calls]
        if len(calls) < 2 or (len(calls) == 2 and batches[0] == batches[1]) or sum(batches) % self.groups:
            return False
        leaves = [leaf for c in calls for leaf in _leaves(c.output)]
        rows_ok = all(leaf.shape and leaf.shape[0] == c.batch for c in calls for leaf in _leaves(c.output))
        return bool(leaves) and rows_ok and len({leaf.dtype for leaf in leaves}) == 1

    def boundary(self, sig: tuple) -> None:
        """A call with the signature of the recorded step's first call: the record is one whole step; learn it."""
        if self.pending or not self.record or sig != self.record[0].signature:
            return
        calls, self.record = self.record, []
        if self.qualifies(calls):
            sources = learn_sources(calls)
            self.cycle = Cycle([_keep_held(call, kept) for call, kept in zip(calls, sources)], sources)
            self.start = calls[0].signature

    def defer(self, pairs: list, names: frozenset = frozenset()) -> None:
        """Compare trusted pairs (of the arguments `names`) on the device, without a read: any difference is kept for
        `check_deferred`."""
        if pairs:
            differs = torch.stack([(a != b).any() for a, b in pairs]).any()
            self.unverified = differs if self.unverified is None else self.unverified | differs
            self.unverified_names |= names

    def check_deferred(self) -> None:
        """ForwardError when a trusted argument differed from its prediction since the last check (one read)."""
        differs, names, self.unverified, self.unverified_names = self.unverified, self.unverified_names, None, set()
        if differs is not None and bool(differs):
            raise ForwardError(
                f"cfg={self.groups}: a later call of a step passed other values of {', '.join(sorted(names))} than "
                "its prediction, which dtp trusts this pipeline to pass (runtime/cfg/passes.py: TRUSTED_ROWS, the "
                "rows of the step's first call; TRUSTED_PAIR, the first call's timestep) and compares on the device "
                "only; the result is wrong. Run it with cfg=1 and report the pipeline."
            )

    def drop(self, *, early: bool = False) -> None:
        """Forget the cycle and the pending answers (learn again from the next step's first call); `early`: the call
        that did not match begins the next step (the pending calls never came), else it is a later call that differs."""
        missed = 0 if early or not self.pending else 1
        self.stats.missed += missed
        self.stats.dropped += len(self.pending) - missed
        learned = self.cycle is not None
        self.cycle, self.pending, self.record = None, [], []
        if learned:  # not on every call of a cached run (`wrapper._step_path`), whose pairs defer their timestep
            self.check_deferred()


def _keep_held(call: Call, sources: dict) -> Call:
    """`call` holding only the arguments a prediction takes from it (HELD): the step's latents are let go."""
    kept = {name: value for name, value in call.arguments.items() if sources.get(name, Source(FIRST)).kind == HELD}
    return Call(kept, call.signature, call.batch, call.output)


def _batch(arguments: dict) -> int:
    from .batch import batch_size

    return batch_size(arguments) or 1


def _leaves(tree) -> list[Leaf]:
    found: list[Leaf] = []
    map_tensors(tree, lambda leaf: found.append(leaf) or leaf, Leaf)
    return found


def run_step(wrapper, cycle: Cycle, arguments: dict) -> list:
    """Every call's output of the step whose first call has `arguments`: this group's passes run, one exchange.

    Returns the outputs of all calls (call 0's first) and the predicted arguments of the later calls (held before
    any forward ran, so that an input a forward changes in place no longer matches).
    """
    predicted = cycle.predict(arguments)
    held = [hold(p) for p in predicted]
    mine = assignment(cycle.batches, wrapper.groups, wrapper.group)
    local = []
    for i, start, stop in mine:
        call = predicted[i]
        batch = cycle.calls[i].batch
        if (start, stop) != (0, batch):
            call = split_arguments(call, batch, start, stop)
        local += [t.reshape(-1) for t in _tensor_leaves(wrapper._call(call))]
    sizes = [_numel(cycle, assignment(cycle.batches, wrapper.groups, g)) for g in range(wrapper.groups)]
    flat = torch.cat(local) if local else torch.empty(0)
    assert flat.numel() == sizes[wrapper.group], "a pass's output differs from the learned one"
    parts = gather_flat(flat, sizes, wrapper.process_group)
    return _rebuild(cycle, parts, wrapper.groups), held


def _tensor_leaves(output) -> list[torch.Tensor]:
    from .tree import leaves

    return leaves(output)


def _numel(cycle: Cycle, mine: list[tuple[int, int, int]]) -> int:
    return sum(_row_numel(leaf) * (stop - start) for i, start, stop in mine for leaf in _leaves(cycle.calls[i].output))


def _row_numel(leaf: Leaf) -> int:
    n = 1
    for size in leaf.shape[1:]:
        n *= size
    return n


def _rebuild(cycle: Cycle, parts: list[torch.Tensor], groups: int) -> list:
    """Each call's output from the groups' flat buffers: its rows, in group order, per leaf."""
    pieces: list[list[list[torch.Tensor]]] = [[[] for _ in _leaves(c.output)] for c in cycle.calls]
    for g, part in enumerate(parts):
        at = 0
        for i, start, stop in assignment(cycle.batches, groups, g):
            for j, leaf in enumerate(_leaves(cycle.calls[i].output)):
                n = _row_numel(leaf) * (stop - start)
                pieces[i][j].append(part[at : at + n].view(stop - start, *leaf.shape[1:]))
                at += n
    outputs = []
    for c, call_pieces in zip(cycle.calls, pieces):
        outputs.append(_fill(c.output, [p[0] if len(p) == 1 else torch.cat(p) for p in call_pieces]))
    return outputs


def _fill(tree, tensors: list[torch.Tensor]):
    """`tree` (leaves as `Leaf`) with its leaves replaced, in order, by `tensors`."""
    it = iter(tensors)
    return map_tensors(tree, lambda _: next(it), Leaf)


def verify(arguments: dict, held: dict, checked: dict, trusted: frozenset = frozenset(), deferred=None) -> bool:
    """Whether a later call equals its held prediction: identity, version and views without a read; the tensors left
    (different objects of the same shape) in ONE fused read, remembered in `checked` for the step (LTX-2's modality
    call passes the same latents object the STG call did). Arguments named in `trusted` (`passes.trusted_rows`) are
    not read: their pairs are appended to `deferred` (compared on the device later, `Steps.defer`)."""
    if arguments.keys() != held.keys():
        return False
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    later: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name, value in arguments.items():
        if not _structure(value, held[name], later if name in trusted and deferred is not None else pairs):
            return False
    todo = [(a, b) for a, b in pairs if checked.get((id(a), a._version, id(b))) is not True]
    if todo:
        equal = bool(torch.stack([(a == b).all() for a, b in todo]).all())
        if not equal:
            return False
    later = [(a, b) for a, b in later if checked.get((id(a), a._version, id(b))) is not True]
    for a, b in todo + later:
        checked[(id(a), a._version, id(b))] = True
    if deferred is not None:
        deferred += later
    return True


def _structure(value, held, pairs: list) -> bool:
    """`tree.matches` without value reads: the tensor pairs that need one are appended to `pairs`."""
    if isinstance(held, Held):
        if not isinstance(value, torch.Tensor) or not held.unchanged():
            return False
        b = held.tensor
        if value is b or (value.shape == b.shape and value.dtype == b.dtype and same_view(value, b)):
            return True
        if value.shape != b.shape or value.dtype != b.dtype or value.device != b.device:
            return False
        pairs.append((value, b))
        return True
    if isinstance(value, torch.Tensor):
        return False
    if isinstance(value, dict) or isinstance(held, dict):
        return (
            isinstance(value, dict)
            and isinstance(held, dict)
            and value.keys() == held.keys()
            and all(_structure(value[k], held[k], pairs) for k in value)
        )
    if isinstance(value, (tuple, list)) or isinstance(held, (tuple, list)):
        return (
            type(value) is type(held)
            and len(value) == len(held)
            and all(_structure(x, y, pairs) for x, y in zip(value, held))
        )
    return same_object(value, held)
