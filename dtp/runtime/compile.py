"""Regional compile: each repeated block of a model compiled once with `fullgraph=True`, its graph reused by every
block of the same class (torch's "regional compilation" recipe; diffusers' `compile_repeated_blocks`).

    compile_blocks(model)                      # inductor; what `dtp.load_pipeline(..., compile=True)` does
    compile_blocks(model, backend="eager")     # dynamo traces only: finds every graph break, runs eagerly

Which modules: those whose class is named in the model's `_repeated_blocks` (FLUX.1: FluxTransformerBlock and
FluxSingleTransformerBlock; under FSDP2 the renamed units that `fsdp.name_repeated_blocks` adds), else each block
of the model's largest `nn.ModuleList` (its most parameters). Everything around the blocks (embedders, the cfg
wrapper, FSDP2's hooks on the root, CP's sequence split at the model's edges) runs eagerly: a few dozen ops per
call against the blocks' thousands.

Why regional and not `torch.compile(model)`: the cold compile costs one trace per block class instead of one of
the whole model (20 vs 38.5 CPU s for tiny FLUX.1 at tp=2, benchmarks/results/compile.md), the same speed once
warm, and a graph break anywhere in the glue costs nothing. `fullgraph=True` makes a break inside a block an
error at its first call rather than a silent slowdown.

Recompiles: the blocks see tensors only (diffusers' pipelines pass the timestep as a tensor), so the steps of a
generation reuse the first step's graphs; a new resolution or prompt length is a new shape, which dynamo compiles
once more with dynamic sizes (`dynamic=None`, torch's automatic dynamic shapes) and then reuses.
"""

from __future__ import annotations

import torch
from torch import nn

from ..choices import COMPILE_BACKENDS
from ..errors import PlanError
from .compile_guards import guard_filter

DEFAULT_BACKEND = "inductor"
COMPILED_ATTR = "_dtp_compiled"  # on a compiled model: its CompileRecord


def compile_backend(value) -> str | None:
    """The dynamo backend `compile=` asks for: False / None -> None (no compile), True -> "inductor", a name of
    `COMPILE_BACKENDS` -> itself; PlanError for anything else (before anything is changed)."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_BACKEND
    if isinstance(value, str) and value in COMPILE_BACKENDS:
        return value
    raise PlanError(
        f"compile={value!r}: expected True, False or a dynamo backend name ({', '.join(COMPILE_BACKENDS)}); "
        f"'eager' traces without generating code (checks graph breaks), 'inductor' is the GPU path."
    )


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules regional compile compiles: those named by the model's `_repeated_blocks` (class names, as
    diffusers matches them), else the children of its largest `nn.ModuleList`; PlanError when it has neither."""
    names = set(getattr(model, "_repeated_blocks", None) or ())
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        raise PlanError(
            f"compile: {type(model).__name__} has no `_repeated_blocks` and no nn.ModuleList of blocks to compile; "
            f"compile it whole with torch.compile(model) instead."
        )
    largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(largest)


def compile_blocks(model: nn.Module, *, backend: str = DEFAULT_BACKEND, fullgraph: bool = True) -> int:
    """Compile the `forward` of each of `repeated_blocks(model)` in place (lazy: traced at its first call, one graph
    per block class reused by every instance); returns how many. Compiling a model twice is a no-op.

    Every mesh axis traces: under compile tp's and Ulysses' collectives and ring's K/V rotation are functional ones
    (`runtime/cp/ring.py`: `permute_tensor`, no P2P), so `fullgraph=True` holds on tp, cp and cfg meshes alike.
    """
    if getattr(model, COMPILED_ATTR, None) is not None:
        return 0
    blocks = repeated_blocks(model)
    for block in blocks:
        # The block's `forward`, not its whole call (diffusers' `compile_repeated_blocks` compiles `_call_impl`):
        # hooks on the block itself then run eagerly around the compiled region. FSDP2's units carry their
        # unshard / reshard hooks and dtp's first-call order hook (`fsdp.follow_first_call`, a list it appends
        # to), which inside the region were traced and guarded on that list's length: a recompile per unit.
        # The DTensor spec guards of parameters the block reads as local tensors are dropped (`compile_guards`)
        options = {"guard_filter_fn": guard_filter(block)}
        block.forward = torch.compile(block.forward, backend=backend, fullgraph=fullgraph, options=options)
    setattr(model, COMPILED_ATTR, backend)
    return len(blocks)


def is_compiled(model) -> bool:
    """Whether `compile_blocks` compiled `model`."""
    return getattr(model, COMPILED_ATTR, None) is not None


def _counts() -> tuple[int, int]:
    """(graphs dynamo has compiled, graph breaks it has met) in this process so far."""
    counters = torch._dynamo.utils.counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


class CompileWatch:
    """Dynamo's counters over one generation: the graphs compiled by the end of step 1, those compiled after it
    (recompiles: a guard failed, e.g. a Python value or a shape that changed between steps) and the graph breaks.

        watch = CompileWatch(); ...; watch.step_ended()   # after each denoising step
        watch.report()  # {"graphs": 4, "recompiles": 0, "graph_breaks": 0}
    """

    def __init__(self) -> None:
        self._start = _counts()
        self._first: tuple[int, int] | None = None

    def step_ended(self) -> None:
        if self._first is None:
            self._first = _counts()

    def report(self) -> dict:
        end = _counts()
        first = self._first or end
        return dict(
            graphs=first[0] - self._start[0], recompiles=end[0] - first[0], graph_breaks=end[1] - self._start[1]
        )
