"""Count the collectives a forward issues, per op and per block, with their tensor bytes.

torch's `CommDebugMode` counts collectives too, but its module tracker was seen to raise
IndexError on diffusers models called with keyword arguments only. This is the small core of it:
a `TorchDispatchMode` that records every op of the c10d and functional-collective namespaces,
which is where both `torch.distributed.*` calls and DTensor redistributions end up. Ops that only
wait on or free a collective's result are not collectives and are skipped.

The scope of a record is the outermost element of an `nn.ModuleList` that was running (e.g.
`transformer_blocks.3`), or "" outside every block, so a test can compare each block with what
the plan implies for it.
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .tracing import eager_flex_attention

COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
# Bookkeeping ops of those namespaces (names without the trailing in-place `_`).
NOT_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd", "barrier", "monitored_barrier", "check_for_nan")


@dataclass(frozen=True)
class Collective:
    """One collective call. `bytes` is the size of its full result (the gathered or reduced tensor)."""

    op: str  # e.g. "all_reduce", "all_gather_into_tensor"
    bytes: int
    scope: str  # the block it ran in, "" outside every block


class ScopedDispatchMode(TorchDispatchMode):
    """A dispatch mode that knows which block of `model` is running: `self.scope` is the outermost block (element
    of an `nn.ModuleList`) in flight, "" outside every block (or when no model is given)."""

    def __init__(self, model: nn.Module | None = None):
        super().__init__()
        self.model = model
        self._scopes: list[str] = []
        self._handles = []

    @property
    def scope(self) -> str:
        return self._scopes[0] if self._scopes else ""

    def __enter__(self):
        if self.model is not None:
            self._handles = scope_hooks(self.model, self._scopes)
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return super().__exit__(*exc)


# c10d's names of the collectives the functional ops name otherwise (the sharded forward calls the ProcessGroup).
C10D_NAMES = {
    "allreduce": "all_reduce",
    "_allgather_base": "all_gather_into_tensor",
    "alltoall_base": "all_to_all_single",
}


def collective_op(func) -> str | None:
    """The collective an aten-level op is ("all_reduce", "all_gather_into_tensor", ...), or None for any other op."""
    op = func._schema.name.split("::")[-1].rstrip("_")
    op = C10D_NAMES.get(op, op)
    return op if func.namespace in COLLECTIVE_NAMESPACES and op not in NOT_COLLECTIVES else None


class CollectiveCounter(ScopedDispatchMode):
    """`with CollectiveCounter(model) as counter: model(**inputs)`; then read `counter.records`.

    `model` (optional) is only used to attribute each record to the block it ran in.
    """

    def __init__(self, model: nn.Module | None = None):
        super().__init__(model)
        self.records: list[Collective] = []
        self._flex = ExitStack()

    def __enter__(self):
        let_flex_attention_through(type(self))
        self._flex.enter_context(eager_flex_attention())
        return super().__enter__()

    def __exit__(self, *exc):
        self._flex.close()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = collective_op(func)
        if op is not None:
            self.records.append(Collective(op, max(_result_bytes(out), _result_bytes(args[:1])), self.scope))
        return out

    def counts(self, scope: str | None = None) -> Counter:
        """`{op: number of calls}`, over every record or those of one scope."""
        return Counter(r.op for r in self.records if scope is None or r.scope == scope)

    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.records)


def let_flex_attention_through(mode_type: type) -> None:
    """Run flex attention (a higher-order op) under a `mode_type` dispatch mode as without it: the op issues no
    collective, and without a rule for the mode's class it raises NotImplementedError. The dispatcher pops the mode
    before calling the rule, so calling the op again runs its dense math uncounted."""
    from torch._higher_order_ops.flex_attention import flex_attention

    if mode_type not in flex_attention.python_key_table:
        flex_attention.py_impl(mode_type)(lambda mode, *args, **kwargs: flex_attention(*args, **kwargs))


def _result_bytes(out) -> int:
    # c10d ops return (tensors, work) or, like `alltoall_base_`, only the work (its output is then their first
    # argument); functional ones return the result tensor.
    return sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))


def block_paths(model: nn.Module) -> list[str]:
    """Paths of every element of every `nn.ModuleList` that no other ModuleList encloses (a None element, as Mochi's
    and Cosmos's VAE blocks hold for a layer they leave out, is no block)."""
    paths: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(f"{p}.") for p in paths):
            paths += [f"{name}.{i}" if name else str(i) for i, child in enumerate(module) if child is not None]
    return paths


def scope_hooks(model: nn.Module, scopes: list[str]) -> list:
    """Forward hooks that keep `scopes` = the stack of blocks running (outermost first)."""
    handles = []
    for path in block_paths(model):
        block = model.get_submodule(path)
        handles.append(block.register_forward_pre_hook(lambda *_, p=path: scopes.append(p)))
        handles.append(block.register_forward_hook(lambda *_, p=path: scopes.remove(p)))
    return handles


# A style's `collective` as `CollectiveCounter` names the op.
COLLECTIVE_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor"}


def implied_collectives(resolved, model: nn.Module) -> dict[str, Counter]:
    """`{scope: {op: count}}` that a plan implies for one forward, as `CollectiveCounter` names them.

    Each planned module issues its style's `collective` once per call: a rowwise / packed_rowwise Linear
    one all-reduce (its partial sums), a colwise_gathered Linear one all-gather (its output shards), an
    rmsnorm_across_heads norm one all-reduce (its sums of squares), a vocab_parallel Embedding one
    all-reduce (its partial lookups); colwise outputs stay sharded and cost nothing. Assumes
    each planned Linear runs once per forward, which holds for the bundled
    architectures; a measured count above this points at a Linear that runs more than once.
    """
    blocks = block_paths(model)
    implied: dict[str, Counter] = {}
    for spec in (*resolved.linears, *resolved.norms):
        op = COLLECTIVE_OPS.get(spec.rule.style.collective)  # what the style issues per call (styles/)
        if op is None:
            continue
        # a planned module that is itself a block (a Linear in a ModuleList: FeedForward.net.2) runs in its own scope
        scope = next((b for b in blocks if spec.path == b or spec.path.startswith(f"{b}.")), "")
        implied.setdefault(scope, Counter())[op] += 1
    return implied
