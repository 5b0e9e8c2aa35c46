"""The cfg axis on a transformer: each call's work spread over the cfg groups, the results exchanged.

`install_cfg(model, mesh)` replaces the instance's `forward` (diffusers' pipelines are not edited;
hooks registered on the model, dtp's CP hooks included, still run around it). Every call takes one of
three paths, the same on every rank:

  batch      the batch (dim 0 of the first input) is at least the number of cfg groups: group g runs
             its rows (`batch.rows`), the outputs are gathered and joined. Doubled-batch pipelines (SD3,
             PixArt-Sigma, Sana, ...) and any list of prompts or num_images_per_prompt > 1.
  pair       two-call pipelines (Qwen-Image / FLUX.1 with true_cfg_scale, Wan, HunyuanVideo, Chroma, ...)
             call the transformer twice per step with the same latents and timestep and different prompt
             embeddings. Group 0 runs the call as given; group 1 runs the *predicted* second call (this
             call with the arguments in which the last pair differed, taken from that pair's second call;
             a pair is two calls with the same first argument, the latents),
             and the two outputs are exchanged. The real second call is then compared with the prediction
             (`tree.matches`): equal, it returns the exchanged output without running anything; different,
             it runs in full. So the result is always exactly what the pipeline asked for; a wrong
             prediction only costs the speedup of that step.
  whole      anything else (a batch of 1 with nothing to predict yet: the first step's two calls, from
             which the prediction is learned): every group runs the call itself.
  step       a step of several calls that is neither a pair nor one batch (LTX-2: a doubled batch, then the
             STG and modality calls; 4 passes), learned from one step on the paths above: at each later step's
             first call every group runs its share of the passes and one all_gather joins them; the later calls
             are answered from it (`steps.py`). Tried before the others on every call.

    step 0: call A (whole), call B (whole; learns: B = A with {encoder_hidden_states, mask, ...} of B)
    step 1: call A' -> group 0 runs A', group 1 runs A' with B's prompt arguments, exchange; call B' == that?
            yes -> B' returns group 1's output (no forward)

No decision reads the GPU where the host can decide alone (a read waits for every queued kernel, the
forward's included). Tensors are held, not copied (`tree.hold`: the object and its version counter), and
compared by identity: diffusers' pipelines pass the same latents and prompt embeddings to both calls of a
step, an in-place change bumps the version. Values are read only for a tensor that is a different object of
the same shape in the hit test, where nothing else can tell (one fused read of them all), and when a pair is
learned. Qwen-Image, FLUX.1 and Chroma compute `timestep / 1000` anew for each call: for their pipelines
(`passes.trusted_pair`) the timestep is compared on the device instead and read once per generation by
`check_predictions` (`dtp run` / `dtp serve` call it), so a steady step reads nothing; Wan passes the same
timestep object. The two flags (hit, predict) are agreed by one all-reduce over the whole mesh on every
pair-or-whole call, so no rank runs a forward its peers skip; it runs on CPU tensors over gloo side groups
(`host.py`), as does the exchange's shape header, so neither drains the GPU's queue.

diffusers' cache hooks (`hooks.py`): the pipeline's `cache_context(name)` is recorded as part of each call
(CONTEXT_KEY), so the prediction learns that the second call runs under "uncond" and group 1 runs it under
"uncond": each group's per-context cache state sees exactly the calls it sees in one process. A hook that
shares one state between the branches makes every call run `whole`. Checked on every call (from a view
rebuilt only when a hook changed, `hooks.hook_view`), so hooks added after the wrapper are seen: one dtp
did not vouch for is a ForwardError before anything runs; so is a missed prediction while a cache is on
(group 1's cache state already took the call that never came).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from torch import nn

from ...errors import ForwardError, PlanError
from ..mesh import CFG_AXIS, cfg_degree
from .batch import batch_size, join_parts, rows, split_arguments
from .call import CallTable
from .exchange import agree_min, gather_parts
from .hooks import SHARED, hook_view
from .host import HostGroups, host_groups
from .passes import check_passes, trusted_pair, trusted_rows
from .steps import NOT_TAKEN, Steps, run_step, signature, verify
from .tree import differences, hold, matches, release

CFG_ATTR = "_dtp_cfg"  # on a model with the cfg axis installed: its CfgParallel
CONTEXT_KEY = "\0cache_context"  # in a call's recorded arguments: the name of its diffusers cache context


@dataclass
class CfgStats:
    """How the calls went: `hits` second calls answered by the exchange, `predicted` calls run as a pair
    (hits + wasted predictions), `batch` calls split over the groups, `whole` calls run by every group."""

    batch: int = 0
    predicted: int = 0
    hits: int = 0
    whole: int = 0


@dataclass
class _Pending:
    arguments: dict  # the predicted second call (held: `tree.hold`)
    output: object  # what group 1 computed for it


@dataclass(eq=False)  # compared and hashed by identity, as the forward it replaces
class CfgParallel:
    """The replacement `forward` of one model (see the module docstring)."""

    forward: object  # the model's own forward, bound
    mesh: object
    signature: inspect.Signature
    stats: CfgStats = field(default_factory=CfgStats)
    host: HostGroups | None = None  # where flags and shape headers go (set by install_cfg)
    template: dict | None = None  # argument name -> value of the last pair's second call (held)
    last: dict | None = None  # the previous call (held), when it was not answered by the exchange
    pending: _Pending | None = None
    model: nn.Module | None = None
    context: object = None  # the diffusers CacheContext the pipeline set for the current call, if any
    batch_split: bool = False  # a call's batch is being split over the groups now (read by dtp's cache layer)
    pipeline: object = None  # a weak reference to the pipeline that calls the model, when dtp was given it

    @functools.cached_property
    def steps(self) -> Steps:
        """The step path's state (`steps.py`): every pass of a step over the groups, one exchange."""
        return Steps(self.groups, self.group)

    @functools.cached_property
    def axis(self):
        """The cfg axis through this rank (slicing a DeviceMesh builds a new one: done once)."""
        return self.mesh[CFG_AXIS]

    @functools.cached_property
    def groups(self) -> int:
        return self.axis.size()

    @functools.cached_property
    def group(self) -> int:
        return self.axis.get_local_rank()

    @functools.cached_property
    def process_group(self):
        """The cfg axis's process group (a DeviceMesh looks it up by name on every `get_group`: ~µs a call)."""
        return self.axis.get_group()

    @functools.cached_property
    def table(self) -> CallTable:
        """The forward's parameters, read once (`call.py`: the arguments by name without `Signature.bind`)."""
        return CallTable(self.signature)

    def __call__(self, *args, **kwargs):
        arguments = self.table.arguments(args, kwargs)
        self._check_hooks()
        check_passes(self.pipeline() if self.pipeline is not None else None, self.groups)
        if self.context is not None:
            arguments[CONTEXT_KEY] = self.context.name
        sig = signature(arguments)
        output = self._step_path(arguments, sig)
        if output is NOT_TAKEN:
            output = self._per_call(arguments)
            if self._cache_state() is None:  # a cache keeps the per-call paths (see `_step_path`): nothing to learn
                self.steps.observe(arguments, sig, output)
        return output

    def _cache_state(self):
        """SHARED / PER_CONTEXT when a stateful hook (a cache) is on the model, else None (`hooks.hook_view`)."""
        return hook_view(self.model)[1] if self.model is not None else None

    def _per_call(self, arguments: dict):
        batch = batch_size(arguments)
        if batch is not None and batch >= self.groups:
            self.pending = self.last = None
            return self._batch(arguments, batch)
        return self._pair_or_whole(arguments)

    def _step_path(self, arguments: dict, sig: tuple):
        """The call's output on the step path (`steps.py`), or NOT_TAKEN: the first call of a learned step runs
        every group's passes and one exchange; a later call is answered from it when it equals its prediction."""
        steps = self.steps
        if steps.pending:
            return self._later(arguments, sig)
        if self._cache_state() is not None:
            # A cache stays on the per-call paths, which keep each cache state's calls as one process makes them: on
            # this path a group would run whole a call whose rows the learning step split over the groups (LTX-2's
            # doubled batch at cfg=2), and its state would see half a batch, then a whole one.
            steps.drop()
            return NOT_TAKEN
        steps.boundary(sig)
        if steps.cycle is None or sig != steps.start:
            return NOT_TAKEN
        outputs, held = run_step(self, steps.cycle, arguments)
        steps.pending, steps.checked, steps.ran = list(zip(held[1:], outputs[1:], steps.cycle.rows()[1:])), {}, True
        steps.stats.steps += 1
        self.pending = self.last = None  # the pair path's state
        return outputs[0]

    def _later(self, arguments: dict, sig: tuple):
        """A later call of a step the step path ran: the exchanged output when it is the predicted call (agreed)."""
        steps = self.steps
        held, output, rows = steps.pending[0]
        deferred: list = []
        trusted = trusted_rows(self.pipeline() if self.pipeline is not None else None) & rows
        (hit,) = self._agree([int(verify(arguments, held, steps.checked, trusted, deferred))])
        if hit:
            steps.defer(deferred, trusted)
            steps.pending.pop(0)
            steps.stats.answered += 1
            return output
        steps.drop(early=sig == steps.start)  # a step that began early: its predicted calls never came
        if self._cache_state() is not None:
            raise ForwardError(
                f"cfg={self.groups}: a cache was enabled while a step ran on the cfg step path and this call is not "
                "the predicted one; each cfg group's cache state took only the calls its group ran. Enable the cache "
                "before the generation (the step path then stands aside) or run with cfg=1."
            )
        return NOT_TAKEN

    def _check_hooks(self) -> None:
        found = hook_view(self.model)[0] if self.model is not None else []
        if found:
            raise ForwardError(
                f"cfg={self.groups}: stateful diffusers hooks dtp did not make rank-consistent "
                f"({', '.join(found[:3])}): a cache added behind dtp would see the other branch's calls on cfg "
                "group 1. Enable caches with model.enable_cache(config) on the sharded model (it goes through "
                "dtp.cache), not diffusers' apply_* functions."
            )

    def _learn(self, arguments: dict) -> dict | None:
        """The prediction template after this call (when it is not a hit).

        A pair shares its first argument (both branches denoise the same latents): then this call is the
        second of a pair and the arguments that differ from the first are the template. Latents that
        changed while a prediction was pending mean the predicted call never came (a step without the
        second call): the template is dropped. Otherwise it is kept.
        """
        if self.last is None:
            return self.template
        if matches(_first(arguments), _first(self.last), values=False):
            return hold(differences(self.last, arguments))
        return None if self.pending is not None else self.template

    def _call(self, arguments: dict):
        name = None
        if CONTEXT_KEY in arguments:
            arguments = dict(arguments)
            name = arguments.pop(CONTEXT_KEY)
        if name is None or self.context is None or name == self.context.name:  # `_context_named` has nothing to do
            return self.table.call(self.forward, arguments)
        with self._context_named(name):
            return self.table.call(self.forward, arguments)

    @contextmanager
    def _context_named(self, name):
        """Run under the cache context `name` (the current one with its name changed), then restore the current."""
        if name is None or self.context is None or name == self.context.name:
            yield
            return
        from diffusers.hooks.hooks import _set_cache_context

        _set_cache_context(self.model, replace(self.context, name=name))
        try:
            yield
        finally:
            _set_cache_context(self.model, self.context)

    def _batch(self, arguments: dict, batch: int):
        self.stats.batch += 1
        start, stop = rows(batch, self.groups, self.group)
        self.batch_split = True
        try:
            output = self._call(split_arguments(arguments, batch, start, stop))
        finally:
            self.batch_split = False
        sizes = [rows(batch, self.groups, g)[1] - rows(batch, self.groups, g)[0] for g in range(self.groups)]
        return join_parts(self._exchange(output), sizes)

    def _exchange(self, output) -> list:
        return gather_parts(output, self.process_group, self.host.cfg, self.host.device)

    def _agree(self, flags: list[int]) -> list[int]:
        return agree_min(flags, self.host.span, self.host.device)

    def _hit(self, arguments: dict, deferred: list) -> bool:
        """Whether this call is the pending prediction (`steps.verify`: identity, version, views; one fused read of the
        tensors nothing else vouches for, except the pipeline's trusted ones, appended to `deferred`)."""
        if self.pending is None:
            return False
        return verify(arguments, self.pending.arguments, {}, self._trusted_pair(), deferred)

    def _trusted_pair(self) -> frozenset:
        return trusted_pair(self.pipeline() if self.pipeline is not None else None)

    def _pair_or_whole(self, arguments: dict):
        deferred: list = []
        mine = self._hit(arguments, deferred)
        template = self.template if mine else self._learn(arguments)  # a hit learns nothing (and reads nothing)
        cached = hook_view(self.model)[1] if self.model is not None else None
        # A state shared by the branches needs both calls on every group.
        predict = not mine and _changes(arguments, template) and cached != SHARED
        # Always agreed (not only when this rank sees a reason to): a decision read from tensor values must
        # never let one rank skip a collective its peers enter.
        hit, predict = (bool(v) for v in self._agree([int(mine), int(predict)]))
        if hit:
            self.steps.defer(deferred, self._trusted_pair())  # read once per generation (`check_predictions`)
            self.stats.hits += 1
            output, self.pending, self.last = self.pending.output, None, None
            return output
        if mine:  # a hit here, a miss on another rank (predict is then False): learn as the others did
            template = self._learn(arguments)
        if self.pending is not None and cached is not None:
            raise ForwardError(
                f"cfg={self.groups}: a cache is on and this call is not the predicted second call of the pair, "
                "whose cache state cfg group 1 has already advanced; this pipeline's calls need cfg=1 with a cache."
            )
        self.template, self.last, self.pending = template, hold(arguments), None
        if not predict:
            self.stats.whole += 1
            return self._call(arguments)
        self.stats.predicted += 1
        predicted = {**arguments, **release(template)}
        held = hold(predicted)  # before the forward: an input it changes in place no longer matches
        parts = self._exchange(self._call(arguments if self.group % 2 == 0 else predicted))
        self.pending = _Pending(held, parts[1])
        return parts[0]


def _first(arguments: dict):
    return next(iter(arguments.values()), None)


def _changes(arguments: dict, template: dict | None) -> bool:
    """Whether the (held) template replaces an argument by another object: then the predicted call differs from
    this one (a different object with equal values only makes group 1 run this call's forward again)."""
    return bool(template) and any(not matches(arguments.get(k), v, values=False) for k, v in template.items())


def install_cfg(model: nn.Module, mesh, *, pipeline=None) -> CfgParallel:
    """Spread `model`'s calls over the mesh's cfg groups (see the module docstring); idempotent. `pipeline`: the
    pipeline that calls it (weakly held), whose passes per step dtp may know (`passes.py`)."""
    existing = getattr(model, CFG_ATTR, None)
    if existing is not None:
        if pipeline is not None:
            existing.pipeline = weakref.ref(pipeline)
        return existing
    check_cfg(model, mesh)
    forward = model.forward
    wrapper = CfgParallel(forward, mesh, inspect.signature(forward), model=model, host=host_groups(mesh))
    wrapper.pipeline = weakref.ref(pipeline) if pipeline is not None else None
    model.forward = wrapper
    if hasattr(model, "cache_context"):  # diffusers' CacheMixin: record the context of each call
        model.cache_context = _recording_context(model, wrapper)
    setattr(model, CFG_ATTR, wrapper)
    return wrapper


def _recording_context(model: nn.Module, wrapper: CfgParallel):
    """`model.cache_context` that also tells the wrapper which context the pipeline's current call runs in."""
    own = type(model).cache_context

    @contextmanager
    def cache_context(name: str, **kwargs):
        from diffusers.hooks.hooks import CacheContext

        with own(model, name, **kwargs):
            wrapper.context = CacheContext(name, **kwargs)
            try:
                yield
            finally:
                wrapper.context = None

    return cache_context


def check_predictions(model: nn.Module | None) -> None:
    """ForwardError when a later call of a step (the step path's, or the pair path's second call) differed from its
    prediction in an argument compared on the device only (`passes.TRUSTED_ROWS`, `passes.TRUSTED_PAIR`); one
    host read. `dtp run` / `dtp serve` call it after each
    generation; a caller of the pipeline itself may too. Nothing to do without the cfg axis."""
    wrapper = getattr(model, CFG_ATTR, None)
    if wrapper is not None:
        wrapper.steps.check_deferred()


def remove_cfg(model: nn.Module) -> None:
    """Undo `install_cfg`: the model's own forward (and cache_context) again."""
    if getattr(model, CFG_ATTR, None) is not None:
        del model.forward
        vars(model).pop("cache_context", None)
        delattr(model, CFG_ATTR)


def check_cfg(model: nn.Module, mesh) -> None:
    """PlanError (nothing changed) when `model` cannot run on the mesh's cfg groups exactly.

    diffusers' cache hooks are checked by `dtp.cache` (which caches run on which axes) and, as they run,
    by the wrapper (hooks dtp did not vouch for).
    """
    if cfg_degree(mesh) == 1:
        raise PlanError("install_cfg: the mesh has no cfg axis > 1; build it with dtp.make_mesh(..., cfg=2).")
