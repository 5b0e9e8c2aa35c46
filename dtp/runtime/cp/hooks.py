"""Forward hooks that cut planned tensors into this rank's sequence chunk and gather outputs back.

Inputs are matched by forward() parameter name whether they arrive positionally or by keyword
(Z-Image calls its blocks positionally, Flux by keyword), by the positions of the signature (`arguments.Binder`).
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import ForwardError
from ...plan.cp import GatherRule, SplitRule
from ..arguments import Binder
from .sequence import flat_chunk, gather_chunks, local_chunk, own_chunk, padded_chunk
from .strided import strided_chunk
from .tail import tail_chunk


class PadSlot:
    """One padded sequence of the current forward: `local` tokens of it on this rank, the first `valid` real;
    `total` its unpadded length; `padded` (the same on every rank) whether any rank holds pad tokens of it."""

    def __init__(self):
        self.local, self.valid, self.total, self.padded = 0, 0, 0, False


class PadState:
    """The padded splits of the current forward, read by the attentions that mask their pad keys and the gathers
    that drop their pad rows.

    Two slots, by where the sequence sits among an attention's local keys (`PadRule.at`): `first` (FLUX.1's text,
    before the image) and `last` (its image). Reset at the start of every model forward (`reset`), set by the hook
    that cuts a padded tensor. When any slot is padded, every rank passes a key mask (all-True on a rank without
    pads), so the masks' all-gathers match across ranks.
    Example: FLUX.1, 7 text + 30 image tokens, cp = 4: text padded to 8 (2 a rank; rank 3: 1 real), image to 32
    (8 a rank; rank 3: 6 real); rank 3's 10 local keys are [t, pad, i, i, i, i, i, i, pad, pad].
    """

    def __init__(self):
        self.slots = {"first": PadSlot(), "last": PadSlot()}
        # split id ("<path>.<input name or output index>") -> (rows a rank, whole unpadded rows) of this forward's
        # cut along the split dim: how a rank knows its global token range (`runtime/cp/kept.py` reads it)
        self.lengths: dict[str, tuple[int, int]] = {}
        self.names: dict[str, str] = {}  # input name -> its slot (`PadRule.at`), for the joint tensors cut by segments

    def slot_of(self, name: str) -> PadSlot | None:
        """The slot of the padded input `name` when this forward padded it, else None."""
        slot = self.slots.get(self.names.get(name, ""))
        return slot if slot is not None and slot.padded else None

    def reset(self, *unused) -> None:
        """Nothing padded: a forward pre-hook on the model, ahead of every split hook, so a slot is padded only when
        a split of this forward padded it (an absent input, e.g. a None modulation mask, leaves it as it is)."""
        for slot in self.slots.values():
            slot.padded = False
        self.lengths.clear()

    def note(self, path: str, name, whole, local, dim: int, total: int | None = None) -> None:
        """Record a cut tensor's rows a rank and whole rows (`lengths`); tuples (RoPE pairs) and counts are not."""
        if isinstance(whole, torch.Tensor) and isinstance(local, torch.Tensor):
            key = f"{path}.{name}" if path else str(name)
            self.lengths[key] = (local.shape[dim], whole.shape[dim] if total is None else total)

    @property
    def padded(self) -> bool:
        return any(slot.padded for slot in self.slots.values())

    def key_valid(self, keys: int, batch: int, device) -> torch.Tensor | None:
        """`[B, keys]` bool, False on this rank's pad keys; None when nothing is padded."""
        if not self.padded:
            return None
        first, last = self.slots.get("first"), self.slots.get("last")  # a `PadView` holds one of them only
        first, last = (s if s is not None and s.padded else None for s in (first, last))
        held = (first.local if first else 0) + (last.local if last else 0)
        if keys < held:
            raise ForwardError(f"cp padding: {keys} local keys cannot hold the {held} padded-segment tokens.")
        position = torch.arange(keys, device=device)
        pad = torch.zeros(keys, dtype=torch.bool, device=device)
        if first:
            pad |= (position >= first.valid) & (position < first.local)
        if last:
            start = keys - last.local
            pad |= position >= start + last.valid
        return torch.logical_not(pad).expand(batch, keys)


class SplitInputs:
    """Pre-hook: replace the named inputs of one module by their local chunks (None inputs pass)."""

    def __init__(
        self, path: str, module: nn.Module, rules: list[SplitRule], rank: int, cp: int, pads: PadState | None = None
    ):
        self.path, self.rules, self.rank, self.cp = path, rules, rank, cp
        self.pads = PadState() if pads is None else pads
        self.binder = Binder(module.forward)
        inputs = [r.name for r in rules] + [n for r in rules for n in r.segments or ()]
        inputs += [r.tail for r in rules if r.tail is not None]  # a `tail` split reads its length input
        self.names = tuple(dict.fromkeys(inputs))
        self.tails = {}  # per call: a `tail` split's length input -> this rank's tail length (`_split_tail`)
        # Joint tensors last: their segment lengths are read from the other inputs once those are local; counts after
        # the tails that set them (`_cut`). Sorted once, each with its name in errors: the hook runs on every forward.
        self.order = sorted(rules, key=lambda r: (bool(r.segments), r.count))
        self.whats = [f"input '{r.name}' of '{path or '<model>'}'" for r in self.order]

    def __call__(self, module, args, kwargs):
        if not self.binder.fixed_positions:  # *args in the signature: bind (dynamo cannot trace it: eager only)
            bound = self.binder.signature.bind(*args, **kwargs)
            self._cut(bound.arguments)
            return bound.args, bound.kwargs
        passed = {name: self.binder.get(args, kwargs, name) for name in self.names}
        arguments = dict(passed)
        self._cut(arguments)
        changed = {name: value for name, value in arguments.items() if value is not passed[name]}
        return self.binder.replace(args, kwargs, changed) if changed else None  # None: the call as it came

    def _cut(self, arguments) -> None:
        """Replace the planned entries of `arguments` (name -> value passed, None if not) by their local chunks."""
        given = dict(arguments)  # global values: a `tail` length is read before a `count` split divides it
        self.tails = {}
        for rule, what in zip(self.order, self.whats):  # joint tensors last, counts after their tails (`__init__`)
            if rule.element is not None:  # one element of a nested argument (JoyImage's ((image RoPE), text RoPE))
                arguments[rule.name] = self._split_element(arguments.get(rule.name), rule)
                continue
            value = arguments.get(rule.name)
            if value is None or (rule.when_dims is not None and getattr(value, "ndim", None) != rule.when_dims):
                continue  # absent, or a per-sample tensor where the rule cuts per-token ones (`when_dims`)
            if rule.count:
                arguments[rule.name] = self._count(value, rule.name, what)
            elif rule.strided:
                arguments[rule.name] = strided_chunk(value, rule.dim, self.rank, self.cp, what, rule.expected_dims)
            elif rule.tail is not None:
                arguments[rule.name] = self._split_tail(value, rule, given.get(rule.tail), what)
            elif rule.pad is not None:
                arguments[rule.name] = self._split_padded(value, rule, what)
            elif rule.segments:
                arguments[rule.name] = self._split_segments(value, rule, arguments, what)
            else:
                arguments[rule.name] = self._split(value, rule, what)
            total = self.pads.slots[rule.pad.at].total if rule.pad is not None else None
            self.pads.note(self.path, rule.name, value, arguments[rule.name], rule.dim, total)

    def _split_element(self, value, rule: SplitRule):
        """A tuple argument with its element `rule.element` cut (`SplitRule.element`: padded with `pad`), the other
        elements whole; a None element, and a None argument, pass."""
        if value is None:
            return None
        what = f"input '{rule.name}'[{rule.element}] of '{self.path or '<model>'}'"
        if not isinstance(value, (tuple, list)) or rule.element >= len(value):
            raise ForwardError(f"cp split of {what}: expected a tuple with element {rule.element}, got {type(value)}.")
        items = list(value)
        if items[rule.element] is not None:
            cut = self._split_padded if rule.pad is not None else self._split
            items[rule.element] = cut(items[rule.element], rule, what)
        return type(value)(items)

    def _split_tail(self, value, rule: SplitRule, tail, what: str):
        """[head_r | tail_r] (`tail.py`); with `pad`, the head and the tail are the `first` and `last` padded
        sequences."""
        chunk, head, rest = tail_chunk(
            value, rule.dim, tail, self.rank, self.cp, what, rule.expected_dims, pad=rule.pad is not None
        )
        self.tails[rule.tail] = rest.local
        if rule.pad is not None:
            for slot, piece in ((self.pads.slots["first"], head), (self.pads.slots["last"], rest)):
                slot.local, slot.valid, slot.total = piece.local, piece.valid, piece.total
                slot.padded = piece.local * self.cp != piece.total
        return chunk

    def _count(self, value, name: str, what: str) -> int:
        """This rank's share of an int sizing the split grid's outer dim (`SplitRule.count`): its whole slices; or,
        for the length of a `tail` split in the same call, the rank's tail length (pad included)."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise ForwardError(f"cp split of {what}: a grid size (`count: true`) must be an int, got {value!r}.")
        if name in self.tails:
            return self.tails[name]
        if value % self.cp:
            raise ForwardError(
                f"cp split of {what}: the token grid's outer size {name}={value} does not divide by the cp degree "
                f"{self.cp}, so a rank's tokens would not be whole slices of it (image rows, video frames); use an "
                f"input whose patch grid has a multiple of {self.cp} there (e.g. {name}={value + (-value) % self.cp}) "
                f"or a cp that divides {value}."
            )
        return value // self.cp

    def _split_padded(self, value, rule: SplitRule, what: str):
        if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return type(value)(self._split_padded(v, rule, f"{what}[{i}]") for i, v in enumerate(value))  # RoPE pairs
        if not isinstance(value, torch.Tensor):
            raise ForwardError(f"cp split of {what}: got a {type(value).__name__}, not a tensor.")
        chunk, valid = padded_chunk(value, rule.dim, self.rank, self.cp, what, rule.expected_dims)
        slot, local = self.pads.slots[rule.pad.at], chunk.shape[rule.dim]
        slot.local, slot.valid, slot.total = local, valid, value.shape[rule.dim]
        slot.padded = local * self.cp != slot.total
        self.pads.names[rule.name] = rule.pad.at
        return chunk

    def _split_segments(self, value, rule: SplitRule, arguments: dict, what: str):
        """Cut each segment of a joint tensor on its own (see `SplitRule.segments`). A segment whose input was padded
        (`PadState.slot_of`) has its unpadded length here: it is zero-padded (False in a bool mask) like its input
        first, so each rank's cut lines up with its tokens (HunyuanVideo's key mask over [video, text])."""
        if not isinstance(value, torch.Tensor) or any(arguments.get(n) is None for n in rule.segments):
            raise ForwardError(f"cp split of {what}: needs a tensor and the inputs {', '.join(rule.segments)}.")
        slots = [self.pads.slot_of(n) for n in rule.segments]
        lengths = [s.total if s else arguments[n].shape[1] * self.cp for n, s in zip(rule.segments, slots)]
        if sum(lengths) != value.shape[rule.dim]:
            raise ForwardError(
                f"cp split of {what}: dim {rule.dim} has {value.shape[rule.dim]} elements, not the "
                f"{' + '.join(map(str, lengths))} of its segments {', '.join(rule.segments)}."
            )
        pieces = []
        for piece, name, slot in zip(value.split(lengths, dim=rule.dim), rule.segments, slots):
            if slot is not None:
                pad = slot.local * self.cp - slot.total
                piece = torch.cat(
                    [piece, piece.new_zeros(*piece.shape[: rule.dim], pad, *piece.shape[rule.dim + 1 :])], rule.dim
                )
            pieces.append(self._split(piece, rule, f"{what} segment {name}"))
        return torch.cat(pieces, rule.dim)

    def _split(self, value, rule: SplitRule, what: str):
        """A tensor, or a tuple/list of tensors (RoPE (cos, sin) pairs passed as one argument), or a dict of them
        (AnyFlow's {"query": freqs, "key": freqs}): each is cut."""
        if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return type(value)(self._split(v, rule, f"{what}[{i}]") for i, v in enumerate(value))
        if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
            return {k: self._split(v, rule, f"{what}[{k!r}]") for k, v in value.items()}
        if not isinstance(value, torch.Tensor):
            raise ForwardError(f"cp split of {what}: got a {type(value).__name__}, not a tensor (or tuple of them).")
        return local_chunk(value, rule.dim, self.rank, self.cp, what, rule.expected_dims)


class SplitOutputs:
    """Forward hook: replace elements of the module's output (index 0 of a bare tensor) by local chunks.

    A rule with `pad` zero-pads its tensor (a token grid: flattened first) to a multiple of cp and records the
    padded sequence in `pads`, as `SplitInputs` does for inputs (Wan's patch embedding and its RoPE tables).
    """

    def __init__(self, path: str, rules: list[SplitRule], rank: int, cp: int, pads: PadState | None = None):
        self.path, self.rules, self.rank, self.cp = path, rules, rank, cp
        self.pads = PadState() if pads is None else pads
        self.whats = [f"output {rule.name} of '{path}'" for rule in rules]  # once: the hook runs on every forward

    def __call__(self, module, args, output):
        single = isinstance(output, torch.Tensor)
        items = [output] if single else list(output)
        for rule, what in zip(self.rules, self.whats):
            if rule.name >= len(items) or not isinstance(items[rule.name], torch.Tensor):
                raise ForwardError(
                    f"cp split of {what}: the module returned {len(items)} item(s) and element {rule.name} is not "
                    f"a tensor."
                )
            if rule.pad is not None:
                items[rule.name] = self._split_padded(items[rule.name], rule, what)
                continue
            cut = flat_chunk if rule.flatten else own_chunk
            whole = items[rule.name]
            items[rule.name] = cut(whole, rule.dim, self.rank, self.cp, what, rule.expected_dims)
            if not rule.flatten:
                self.pads.note(self.path, rule.name, whole, items[rule.name], rule.dim)
        return items[0] if single else type(output)(items)

    def _split_padded(self, x: torch.Tensor, rule: SplitRule, what: str) -> torch.Tensor:
        if rule.expected_dims is not None and x.ndim != rule.expected_dims:
            raise ForwardError(
                f"cp split of {what}: expected a {rule.expected_dims}-D tensor, got shape {tuple(x.shape)}; the "
                f"plan's `expected_dims` does not match how this model is called."
            )
        flat = x.flatten(rule.dim) if rule.flatten else x
        chunk, valid = padded_chunk(flat, rule.dim, self.rank, self.cp, what)
        chunk = chunk.clone(memory_format=torch.contiguous_format)
        slot, local = self.pads.slots[rule.pad.at], chunk.shape[rule.dim]
        slot.local, slot.valid, slot.total = local, valid, flat.shape[rule.dim]
        slot.padded = local * self.cp != slot.total
        if rule.flatten:
            chunk = chunk.reshape(*x.shape[: rule.dim], *([1] * (x.ndim - rule.dim - 1)), local)
        return chunk


class GatherOutput:
    """Forward hook: all-gather the module's output on the `cp` group, in rank order.

    A bare tensor, or every tensor of a tuple (HiDream's dual-stream block returns (image, text), each
    split on its own by the block's pre-hook, so each is gathered on its own), or only element `rule.element` of it.
    """

    def __init__(self, path: str, rule: GatherRule, group, pads: PadState | None = None):
        self.path, self.rule, self.group, self.pads = path, rule, group, pads
        self.what = f"output of '{path}'"  # once: the hook runs on every forward

    def __call__(self, module, args, output):
        if self.rule.element is not None:  # one element of a tuple output (`GatherRule.element`)
            i = self.rule.element
            if not isinstance(output, tuple) or i >= len(output) or not isinstance(output[i], torch.Tensor):
                raise ForwardError(f"cp gather at '{self.path}': expected a tuple output with a tensor element {i}.")
            return output[:i] + (self._gather(output[i], f"output {i} of '{self.path}'"),) + output[i + 1 :]
        if isinstance(output, tuple) and output and all(isinstance(o, torch.Tensor) for o in output):
            return tuple(self._gather(o, f"output {i} of '{self.path}'") for i, o in enumerate(output))
        if not isinstance(output, torch.Tensor):
            raise ForwardError(
                f"cp gather at '{self.path}': the module returned a {type(output).__name__}, not a tensor "
                f"(or a tuple of tensors)."
            )
        return self._gather(output, self.what)

    def _gather(self, x: torch.Tensor, what: str) -> torch.Tensor:
        whole = gather_chunks(x, self.rule.dim, self.group, what, self.rule.expected_dims)
        if self.rule.trim is None or self.pads is None:
            return whole
        slot = self.pads.slots[self.rule.trim]  # the padded sequence this output is: drop its pad rows (at its end)
        if not slot.padded:
            return whole
        if whole.shape[self.rule.dim] != slot.local * self.group.size():
            raise ForwardError(
                f"cp gather of {what}: {whole.shape[self.rule.dim]} rows, not the {slot.local} x cp padded "
                f"'{self.rule.trim}' sequence whose pad rows `trim` drops."
            )
        return whole.narrow(self.rule.dim, 0, slot.total)
