"""The full-size trace engine: a component built on meta, sharded on rank 0 of a fake world, traced on fake tensors.

    trace_sharded(module, world, shard, calls)   inside torch's fake process group of `world` ranks (`fakepg.py`):
        `shard(module)` (prepare / apply, the parallel VAE, or nothing), every parameter made a fake cpu tensor,
        optionally quantized (after sharding, as `dtp.quantize` runs), then each call traced under
        `trace.PhaseTrace` (live-storage peak, FLOPs, collectives; repeated submodule calls replayed, `repeats.py`).
        Returns ({key: Trace, or the error that call raised}, this rank's resident bytes by block scope).

Callers decide the depth: `dtp fit` cuts every block list to its first block (`trace.truncate_blocks`) and scales
the block's figures; `dtp check` traces its model whole, so its collectives are the exact count of one forward.

    forward_peak(class_name, plan, cp=, tp=, shape=)   one transformer forward at `shape` (`inputs.forward_inputs`),
        each block list cut to its first block, sharded by `plan` exactly as `parallelize` shards it (cp hooks
        included: this rank runs its 1/cp of the sequence and the real all-to-alls / ring passes): its peak
    peak_report(...)   that peak at (cp, tp) next to one rank's:

        ideal = one rank's peak / (cp * tp)       ratio = per-rank peak / ideal (1.00: perfectly divided)
        whole = the tensors alive at the per-rank peak that no rank divides, and what they add above ideal
                (`whole.whole_at_peak`: why a ratio is what it is)

Why one block per list is enough for the peak of a stack of alike blocks: only the residual stream (and what the
model computes once before its blocks: RoPE tables, modulation, text states) crosses a block boundary, so the
forward's peak is reached inside one block or in the head/tail, and a cut model has both (checked on FLUX.1 by the
unit tests, and at full size: FLUX.1-dev tp=4 at 1024^2, 245,419,012 bytes cut and whole). Not for a stack whose
blocks differ: SD3.5-L's last block (context only) makes the whole forward's peak at tp=2 92.6 MB where the cut one
says 88.5 MB, so `dtp check`, which traces its sharded model whole, takes its one-rank reference whole too.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import torch

from ..engine import apply, prepare
from ..errors import ForwardError, PlanError
from ..plan import Plan
from ..policy import check_degree
from ..quant import config_for, quantize
from ..runtime.cp.grid import HoldTokens
from ..runtime.cp.hooks import GatherOutput, SplitInputs, SplitOutputs
from .fakepg import built_meta_model, fake_mesh, fake_world
from .inputs import ForwardShape, forward_inputs
from .trace import Trace, block_lists, cut_copy, fake_like, fake_mode, param_bytes_by_scope, to_fake, trace_call
from .whole import whole_at_peak

INDEXED_LISTS = ("caption_projection",)  # HiDream's forward indexes it per text layer: kept whole, not cut
DEFAULT_SHAPE = ForwardShape()  # a 1024^2 image, or a video model's usual clip
EXPECTED = (PlanError, ForwardError)  # a call refused for its shape (e.g. cp not dividing the sequence)


def call_module(module, **kwargs):
    return module(**kwargs)


@dataclass(frozen=True)
class Call:
    """One call to trace: its kwargs (meta tensors; made fake for the trace), how to make it, what to replay."""

    kwargs: dict
    run: Callable = call_module
    """(module, **kwargs) -> output, e.g. `module(**kwargs)` or `vae.decode(z)`."""
    repeated: tuple[str, ...] = ()
    """Paths of submodules called many times alike, replayed after two runs (`repeats.py`)."""


def trace_sharded(
    module: torch.nn.Module,
    world: int,
    shard: Callable[[torch.nn.Module], None],
    calls: Mapping,
    *,
    quant: str | None = None,
    catch: tuple[type[Exception], ...] = EXPECTED,
    device: str = "cpu",
) -> tuple[dict, Counter]:
    """({key: Trace or the exception of type `catch` its call raised}, resident bytes by scope) of `module` (on meta,
    mutated: sharded and made fake on `device`: cpu, or cuda for what a GPU runs) on rank 0 of a fake world of
    `world` ranks (module docstring). A value of `calls` that is an exception already (its inputs could not be built)
    is passed through."""
    with fake_world(world):
        shard(module)
        if not calls:  # figures of the sharded meta module only
            return {}, param_bytes_by_scope(module)
        with fake_mode():
            to_fake(module, device)
            if quant is not None:
                quantize(module, config_for(quant))
            weights = param_bytes_by_scope(module)
            traces = {key: _trace_one(module, call, catch, device) for key, call in calls.items()}
    return traces, weights


def _trace_one(module, call, catch, device):
    if isinstance(call, Exception):
        return call
    try:
        inputs = {k: fake_like(v, device) for k, v in call.kwargs.items()}
        return trace_call(module, call.run, inputs, call.repeated, device)
    except catch as exc:
        return exc


def shard_with_plan(module, plan: Plan | None, *, tp: int, cp: int, cp_mode: str, pad: bool, device: str = "cpu"):
    """`prepare` + `apply` on a (cp, tp) mesh inside the fake world (cp hooks included); the Prepared, or None at one
    rank (nothing to shard)."""
    if tp * cp == 1:
        return None
    prepared = prepare(module, fake_mesh(tp=tp, cp=cp, device=device), plan, cp_mode=cp_mode, pad=pad)
    apply(module, prepared)
    return prepared


@dataclass(frozen=True)
class ForwardPeak:
    """One rank's activation peak of one forward, and what the forward ran on."""

    peak_bytes: int
    tokens: int
    """Image / video tokens of the whole sequence (before the cp split)."""
    input: str
    """The input in the model's terms (`1024x1024 px, ...`, `81 frames of 480x832 px = latent video ...`)."""
    guessed: int = 0
    """Data-dependent values the fake forward guessed (`trace.Trace.guessed_branches`)."""
    trace: Trace | None = field(default=None, compare=False, repr=False)
    """The trace it came from (what was alive at the peak: `whole.whole_at_peak`)."""


def forward_peak(
    class_name: str,
    plan: Plan | None,
    *,
    cp: int = 1,
    tp: int = 1,
    cp_mode: str = "ulysses",
    pad: bool = False,
    shape: ForwardShape = DEFAULT_SHAPE,
    dtype: torch.dtype = torch.bfloat16,
    config: dict | None = None,
    cut: bool | None = True,
    device: str = "cpu",
) -> ForwardPeak:
    """The activation peak of rank 0 of a (cp, tp) world in one forward at `shape`, one block per list unless `cut`
    is False (module docstring; None: cut where every block list's blocks are alike, `alike_blocks`), on fake
    `device` tensors. PlanError when the plan refuses (cp, tp) or the model has
    no input builder; ForwardError from the cp hooks when cp does not divide the sequence."""
    check_degree(cp, "forward peak: cp")
    check_degree(tp, "forward peak: tp")
    built = built_meta_model(class_name, config, dtype)
    cut = cut or (cut is None and alike_blocks(built))
    model = cut_copy(built, keep=1, skip=INDEXED_LISTS) if cut else copy.deepcopy(built)
    inputs = forward_inputs(class_name, dict(model.config), dtype, shape)
    shard = partial(shard_with_plan, plan=plan, tp=tp, cp=cp, cp_mode=cp_mode, pad=pad, device=device)
    traces, _ = trace_sharded(model, cp * tp, shard, {0: Call(inputs.kwargs)}, device=device)
    trace = traces[0]
    if isinstance(trace, Exception):
        raise trace
    return ForwardPeak(trace.peak_bytes, inputs.tokens, inputs.described, trace.guessed_branches, trace)


def peak_report(
    class_name: str,
    plan: Plan | None,
    *,
    cp: int,
    tp: int,
    cp_mode: str = "ulysses",
    pad: bool = False,
    shape: ForwardShape = DEFAULT_SHAPE,
    dtype: torch.dtype = torch.bfloat16,
    config: dict | None = None,
    one: ForwardPeak | None = None,
    sharded: ForwardPeak | None = None,
    cut: bool | None = True,
    device: str = "cpu",
) -> dict:
    """`forward_peak` at (cp, tp) (`sharded`, when traced already) and at (1, 1) (`one`, likewise), with
    ideal = one rank / (cp tp) and their ratio (a dict). `cut`, `device`: as `forward_peak`'s."""
    common = dict(shape=shape, dtype=dtype, config=config, cut=cut, device=device)
    one = one or forward_peak(class_name, plan, **common)
    sharded = sharded or forward_peak(class_name, plan, cp=cp, tp=tp, cp_mode=cp_mode, pad=pad, **common)
    ideal = one.peak_bytes / (cp * tp)
    report = {
        "cp": cp,
        "tp": tp,
        "cp_mode": cp_mode,
        "input": one.input,
        "tokens": one.tokens,
        "one_rank_bytes": one.peak_bytes,
        "per_rank_bytes": sharded.peak_bytes,
        "ideal_bytes": int(ideal),
        "ratio": sharded.peak_bytes / ideal,
        "guessed": max(one.guessed, sharded.guessed),
    }
    if cp * tp > 1 and one.trace is not None and sharded.trace is not None:  # what stays whole, and its cost
        whole = whole_at_peak(sharded.trace, one.trace, cp=cp, tp=tp, per_rank=sharded.peak_bytes, ideal=ideal)
        report["whole"] = whole
    return report


def alike_blocks(model: torch.nn.Module) -> bool:
    """Whether the blocks of each block list have the same parameters (names, shapes, dtypes) and module types: then
    the peak of the whole forward is the cut one's (module docstring). SD3.5-L's context-only last block is not."""
    for path in block_lists(model):
        if path in INDEXED_LISTS:
            continue
        blocks = list(model.get_submodule(path))
        signatures = {block_signature(block) for block in blocks}
        if len(signatures) > 1:
            return False
    return True


def hooks_alike(model: torch.nn.Module) -> bool:
    """Whether a cut to the first block of each block list keeps every hook the forward needs: every block after the
    first carries the same hooks (counts per submodule), and none carries cp hooks of a kind the first lacks (also in
    a list of two blocks). Kandinsky 5's and 6's plans hold their visual tokens at `visual_transformer_blocks.-1`
    (`cp.grid`; a gather before): cut after sharding, the hook went with the last block (and the forward's unflatten
    failed on the rank's 1/cp of the tokens); such a model is traced whole."""
    for path in block_lists(model):
        blocks = list(model.get_submodule(path))
        if path not in INDEXED_LISTS and len({_hooks(block) for block in blocks[1:]}) > 1:
            return False
        if blocks and any(_cp_hook_kinds(block) - _cp_hook_kinds(blocks[0]) for block in blocks[1:]):
            return False
    return True


def _cp_hook_kinds(block: torch.nn.Module) -> set:
    hooks = (*block._forward_pre_hooks.values(), *block._forward_hooks.values())
    return {type(hook) for hook in hooks if isinstance(hook, (GatherOutput, SplitInputs, SplitOutputs, HoldTokens))}


def _hooks(block: torch.nn.Module) -> tuple:
    return tuple((len(m._forward_pre_hooks), len(m._forward_hooks)) for m in block.modules())


def block_signature(block: torch.nn.Module) -> tuple:
    params = tuple((name, tuple(p.shape), p.dtype) for name, p in block.named_parameters())
    return params, tuple(type(m).__name__ for m in block.modules())


def trace_peak(trace: Trace, inputs) -> ForwardPeak:
    """A `ForwardPeak` from a trace of `inputs` (`inputs.FullInputs`) traced elsewhere (`dtp check`'s one trace)."""
    return ForwardPeak(trace.peak_bytes, inputs.tokens, inputs.described, trace.guessed_branches, trace)
