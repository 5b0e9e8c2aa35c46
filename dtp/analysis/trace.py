"""One pass over a phase's forward on fake tensors: its activation peak, its FLOPs and its collectives.

`PhaseTrace` is a `TorchDispatchMode` that sees every op of a forward run under `FakeTensorMode`
(shapes, dtypes and devices, no data, no memory) and records three things:

    live bytes   every storage an op creates is counted until it is freed (a weakref finalizer on the
                 storage), so `peak_bytes` = max over the forward of the bytes alive that were not
                 there before (parameters, buffers and the inputs are left out: they are resident)
    FLOPs        torch's own formulas (`torch.utils.flop_counter.flop_registry`: mm, addmm, bmm,
                 convolution, scaled-dot-product attention), applied to each rank's *local* shapes
                 (a DTensor argument counts as its local shard), so a colwise Linear of tp=4 counts
                 1/4 of the full matmul and a replicated one all of it
    collectives  the c10d / functional-collective ops with their result bytes (as `CollectiveCounter`)
    kernels      what a GPU would be asked to run, by block scope: each attention kernel (the aten op dispatched),
                 the matmuls by dtype, the host syncs (`_local_scalar_dense`, `aten.equal`, device-to-host copies,
                 ops of data-dependent size) and host-to-device copies (`kernels.py` summarises them); FLOPs of
                 fp32 / fp64 matmuls and attention are kept apart too (`fp32_flops`: no tensor cores)

Why not torch's `MemTracker`: it refuses a module called twice in one region (Wan's frame-by-frame
VAE, Qwen-Image's causal decoder) and counts parameters as well; live storages are all we need.
Why fake tensors on the cpu device and not the meta device: scaled-dot-product attention picks its
kernel by device; on meta it falls back to the math path, which materializes the full attention matrix
(FLUX.1-dev at 1024^2: 4.6 GB instead of 0.49 GB); on cpu (fake) it takes the flash kernel, whose
memory is what a GPU's flash / efficient attention needs too. `device="cuda"` (`trace_call`, `to_fake`,
`fake_like`) runs the forward on fake CUDA tensors through `cuda.CudaRoute`: the code's CUDA branches and the
attention kernels a CUDA build picks (`dtp check --kernels`, `dtp fit`'s transformer).

Records are attributed to the outermost block (element of an `nn.ModuleList`) that was running,
like `CollectiveCounter`, so a forward traced with each block list cut to its first element
(`truncate_blocks`) gives the full model's figures by `scale_blocks`: FLOPs and collectives of the
first block times the original count. The peak of a forward of identical blocks is the peak of one
of them (only the residual stream crosses a block boundary), which a unit test checks on FLUX.1.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import flop_registry, sdpa_flop_count, shape_wrapper

from ..runtime.cfg.tree import leaves
from ..runtime.memory import local_tensor_bytes
from .bounds import MaskCounts
from .collectives import ScopedDispatchMode, block_paths, collective_op, let_flex_attention_through
from .cuda import CudaRoute
from .repeats import repeated_calls
from .tracing import eager_flex_attention
from .whole import PeakTensors

FAKE_DEVICE = "cpu"  # fake tensors live "on" cpu: SDPA then takes its flash kernel (see the module docstring)


@shape_wrapper
def _cpu_flash_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


# torch's registry covers the CUDA attention kernels; the cpu flash kernel (what fake cpu tensors take) has
# the same cost: 2 matmuls of [L, S] x d per head (4 L S d FLOPs per head and batch element).
FLOP_FORMULAS = {
    **flop_registry,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
}
aten = torch.ops.aten
ATTENTION_OPS = {
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_fused_attention_overrideable,
    aten._flash_attention_forward,
    aten._efficient_attention_forward,
    aten._safe_softmax,  # only SDPA's math path emits it: the unfused attention (scores materialized)
}
MATMUL_OPS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._scaled_mm, aten._int_mm, aten.convolution}
SYNC_OPS = {aten._local_scalar_dense, aten.equal}  # the host waits for the device's value (.item(), bool, equal)
WIDE = (torch.float32, torch.float64)  # dtypes tensor cores do not take (without TF32, which dtp never enables)


class CollectiveRecord(NamedTuple):
    """One collective of a trace."""

    op: str
    bytes: int
    group: int
    """Ranks of its process group."""
    scope: str
    """The block it ran in, "" outside every block."""
    group_name: str = ""
    """Its process group's name (tells a mesh axis from another of the same size)."""


@dataclass
class Trace:
    """What one traced forward did on this rank."""

    peak_bytes: int = 0
    """Largest sum of live bytes created during the forward (activations, workspace, outputs)."""
    flops: Counter = field(default_factory=Counter)
    """FLOPs by scope: block path (e.g. "transformer_blocks.0") or "" outside every block."""
    collectives: list = field(default_factory=list)
    """A `CollectiveRecord` for every collective: bytes of its result (of its input for a send)."""
    output_bytes: int = 0
    """Bytes of the call's output (its tensors' full sizes)."""
    guessed_branches: int = 0
    """Data-dependent values the fake forward could not know and guessed (`PhaseTrace`): boolean tests taken as
    False, masks taken as selecting every element."""
    fp32_flops: Counter = field(default_factory=Counter)
    """The part of `flops` (by scope) whose inputs are fp32 / fp64: no tensor cores."""
    device: str = FAKE_DEVICE
    """The fake device the forward ran on (`trace_call`)."""
    kernels: Counter = field(default_factory=Counter)
    """(scope, kind, name) -> calls; kind "attention" (name: op and dtype), "matmul" (dtype), "sync" (why the host
    waits), "h2d" (host-to-device copies)."""
    at_peak: tuple = ()
    """The storages alive at the peak (`whole.Made`: bytes, shape, dtype, the op and module that made each)."""
    made: frozenset = frozenset()
    """(shape, dtype) of every storage the forward made (`whole.whole_at_peak` tells the undivided ones by it)."""

    def total_flops(self) -> int:
        return sum(self.flops.values())


class PhaseTrace(ScopedDispatchMode):
    """`with PhaseTrace(model, resident) as t: model(**inputs)`; then read `t.trace`.

    `resident`: tensors alive before the forward (parameters, buffers, inputs); their storages are not
    counted even when an op returns a view of one. `masks`: integer inputs holding 0 / 1 (`bounds.MaskCounts`).
    """

    def __init__(self, model: nn.Module | None = None, resident=(), masks=()):
        super().__init__(model)
        self.trace = Trace()
        self._resident = {id(s): s for t in resident for s in _inner_storages(t)}
        self._live: dict[int, int] = {}
        self._current = 0
        self.tensors = PeakTensors()  # what each live tensor is, and those alive at the peak (`whole.py`)
        self._counts = MaskCounts(masks)  # a mask's count read on the host: its upper bound (`bounds.py`)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except DataDependentOutputException:
            return self._guess(func, args)
        except DynamicOutputShapeException:
            out = self._all_selected(func, args)
            self.trace.kernels[(self.scope, "sync", f"data-dependent size ({func._overloadpacket.__name__})")] += 1
        self._counts.record(func, args, kwargs, out)
        scope = self.scope
        packet = func._overloadpacket
        if packet in FLOP_FORMULAS:
            flops = _flops(packet, args, kwargs, out)
            self.trace.flops[scope] += flops
            if _first_tensor(args).dtype in WIDE:
                self.trace.fp32_flops[scope] += flops
        self._kernel(scope, func, args, kwargs)
        op = collective_op(func)
        if op is not None:
            nbytes = max(_bytes(out), _bytes(args[0]) if args else 0)
            size, name = _group(args)
            self.trace.collectives.append(CollectiveRecord(op, nbytes, size, scope, name))
        for tensor in tree_leaves(out):
            self._track(tensor, packet.__name__)
        if self._current > self.trace.peak_bytes:
            self.trace.peak_bytes = self._current
            self.tensors.peak()
        return out

    def _kernel(self, scope: str, func, args, kwargs) -> None:
        """The `Trace.kernels` record of one op, if it is an attention kernel, a matmul, a sync or a copy."""
        packet = func._overloadpacket
        key = None
        if packet in ATTENTION_OPS:
            key = ("attention", f"{packet.__name__} {_dtype_name(_first_tensor(args).dtype)}")
        elif packet in MATMUL_OPS:
            key = ("matmul", _dtype_name(_first_tensor(args).dtype))
        elif packet in SYNC_OPS:
            key = ("sync", packet.__name__)
        elif packet in (aten._to_copy, aten.copy_):
            key = _copy_kind(packet, args, kwargs)
        if key is not None:
            self.trace.kernels[(scope, *key)] += 1

    def _guess(self, func, args) -> bool:
        """A fake tensor has no values, so `if torch.all(image_embeds == 0):` (HunyuanVideo 1.5's text-to-video test)
        cannot be decided: a boolean one is taken as False and counted (`Trace.guessed_branches`, which the reports
        print). Both sides of such a test build tensors of the same shapes in the models seen so far; anything else
        (an integer `.item()` that sizes a tensor: MoE routing counts) still raises, unless it counts a mask's set
        elements (`bounds.MaskCounts`: taken as all of them; FramePack's prompt length at batch 1)."""
        if func is not torch.ops.aten._local_scalar_dense.default:
            raise  # the exception being handled, as the fake mode raised it
        if args[0].dtype is not torch.bool:
            bound = self._counts.bound(args[0])
            if bound is None:
                raise
            self.trace.guessed_branches += 1
            self.trace.kernels[(self.scope, "sync", "_local_scalar_dense")] += 1
            return bound
        self.trace.guessed_branches += 1
        self.trace.kernels[(self.scope, "sync", "_local_scalar_dense")] += 1
        return False

    def _all_selected(self, func, args):
        """`aten.nonzero` of a fake mask, and `x[mask]`, have no known length: taken as every element selected (numel
        rows), the largest the selection can be, and counted with the guessed branches (HunyuanVideo 1.5 gathers its
        prompt's tokens by mask). Any other op of data-dependent size still raises."""
        if func is torch.ops.aten.nonzero.default:
            self.trace.guessed_branches += 1
            return torch.empty((args[0].numel(), args[0].dim()), dtype=torch.long, device=args[0].device)
        if func is torch.ops.aten.index.Tensor:  # x[mask]: the mask's k dims become k index vectors of numel each
            indices = []
            for index in args[1]:
                if index is not None and index.dtype is torch.bool:
                    self.trace.guessed_branches += 1
                    shape = (index.dim(), index.numel())
                    indices += list(torch.empty(shape, dtype=torch.long, device=index.device).unbind())
                else:
                    indices.append(index)
            return func(args[0], indices)
        raise  # the exception being handled, as the fake mode raised it

    @property
    def live_bytes(self) -> int:
        """Bytes created during the forward and alive now."""
        return self._current

    def _track(self, tensor, op: str = "") -> None:
        storage = _storage(tensor)
        if storage is None or id(storage) in self._resident or id(storage) in self._live:
            return
        nbytes = storage.nbytes()
        self._live[id(storage)] = nbytes
        self._current += nbytes
        self.tensors.add(id(storage), nbytes, tensor._local_tensor if isinstance(tensor, DTensor) else tensor, op)
        weakref.finalize(storage, self._free, id(storage))

    def _free(self, key: int) -> None:
        self._current -= self._live.pop(key, 0)
        self.tensors.free(key)


def _storage(tensor):
    if isinstance(tensor, DTensor):
        tensor = tensor._local_tensor
    if not isinstance(tensor, torch.Tensor):
        return None
    return tensor.untyped_storage()


def _inner_storages(tensor) -> list:
    """The storages a resident tensor holds: a DTensor's local shard's; a tensor subclass's (torchao's quantized
    weights: data and scales, `__tensor_flatten__`) inner tensors', recursively; a plain tensor's own."""
    if isinstance(tensor, DTensor):
        return _inner_storages(tensor._local_tensor)
    if not isinstance(tensor, torch.Tensor):
        return []
    if type(tensor) is not torch.Tensor and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return [s for name in names for s in _inner_storages(getattr(tensor, name))]
    return [tensor.untyped_storage()]


def _first_tensor(args):
    tensor = next(t for t in tree_leaves(args) if isinstance(t, torch.Tensor))
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _copy_kind(packet, args, kwargs) -> tuple[str, str] | None:
    """("sync", "device-to-host copy") / ("h2d", "host-to-device copy") for a copy between cpu and an accelerator."""
    if packet is aten.copy_:
        source, target = _local(args[1]).device, _local(args[0]).device
    else:
        source = _local(args[0]).device
        target = torch.device(kwargs.get("device") or source)
    if source.type == target.type or "meta" in (source.type, target.type):
        return None
    if target.type == "cpu":
        return ("sync", "device-to-host copy")
    return ("h2d", "host-to-device copy") if source.type == "cpu" else None


def _local(value):
    return value._local_tensor if isinstance(value, DTensor) else value


def _flops(packet, args, kwargs, out) -> int:
    """torch's FLOP formula for `packet` on this rank's local shapes."""
    local_args, local_kwargs, local_out = tree_map(_local, (args, kwargs, out))
    return FLOP_FORMULAS[packet](*local_args, **local_kwargs, out_val=local_out)


def _bytes(out) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))


def _group(args) -> tuple[int, str]:
    """(ranks, name) of the collective's group: a ProcessGroup argument (c10d ops) or a group name (functional
    ones); (0, "") when none is found."""
    for arg in args:
        if isinstance(arg, torch.ScriptObject):  # c10d ops pass the ProcessGroup boxed
            group = dist.ProcessGroup.unbox(arg)
            return group.size(), group.group_name
        if isinstance(arg, str):
            try:
                return _resolve_process_group(arg).size(), arg
            except (RuntimeError, ValueError, KeyError):
                continue
    return 0, ""


# ---------------------------------------------------------------------------------------------
# blocks: trace one of each list, count all of them


def block_lists(model: nn.Module) -> dict[str, int]:
    """`{path: length}` of every `nn.ModuleList` that no other ModuleList encloses (the block stacks)."""
    lists: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(f"{p}.") for p in lists):
            lists[name] = len(module)
    return lists


def truncate_blocks(model: nn.Module, keep: int = 1, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Cut every block list of `model` to its first `keep` elements, in place; returns the original lengths.

    Only for models whose forward iterates its lists (`for block in self.blocks`), as diffusers' DiTs
    and transformers' encoders do; `scale_blocks` then restores the full counts. Lists named in `skip`
    (paths) are left whole: a forward that indexes them (HiDream's `caption_projection[i]`).
    """
    lengths = {path: n for path, n in block_lists(model).items() if path not in skip}
    for path, length in lengths.items():
        if length > keep:
            parent, _, name = path.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, name, nn.ModuleList(list(getattr(owner, name))[:keep]))
    return lengths


def cut_copy(model: nn.Module, keep: int = 1, skip: tuple[str, ...] = ()) -> nn.Module:
    """A deep copy of `model` with its block lists cut as `truncate_blocks` cuts them, without copying the blocks it
    drops (FLUX.1-dev: 2 of 57 blocks copied; the one-rank reference of `dtp check`'s peak). A model whose kept part
    reaches a dropped block some other way (a submodule registered twice) is copied whole, then cut: the copy never
    shares a module with `model`."""
    dropped = {}
    for path in block_lists(model):
        if path not in skip:
            dropped.update({id(block): block for block in list(model.get_submodule(path))[keep:]})
    memo = dict(dropped)
    cut = copy.deepcopy(model, memo)
    truncate_blocks(cut, keep, skip)
    if any(id(module) in dropped for module in cut.modules()):
        cut = copy.deepcopy(model)
        truncate_blocks(cut, keep, skip)
    return cut


def param_bytes_by_scope(model: nn.Module) -> Counter:
    """This rank's resident bytes by block scope (as `PhaseTrace` scopes its records): parameters (local shards of
    DTensors, data + scales of quantized weights: `runtime.memory.local_tensor_bytes`), registered buffers and the
    tensors modules hold as plain attributes, both living as long as the model (e.g. Qwen-Image's rope tables
    `pos_freqs`, `neg_freqs`: 2 x 4096 positions x 64 complex64 = 4 MB at full size, 10 % of the tiny pipeline's peak;
    Wan's rope buffers `freqs_cos`, `freqs_sin`: 4 KB of the tiny Wan's 0.79 MB of weights, 0.5 %)."""
    blocks = block_paths(model)
    found = Counter()
    for name, param in model.named_parameters():
        scope = next((b for b in blocks if name.startswith(f"{b}.")), "")
        found[scope] += local_tensor_bytes(param)
    seen = set()
    for name, buffer in model.named_buffers():  # named_buffers yields a shared buffer once
        seen.add(id(buffer))
        scope = next((b for b in blocks if name.startswith(f"{b}.")), "")
        found[scope] += local_tensor_bytes(buffer)
    for path, module in model.named_modules():
        for tensor in vars(module).values():
            if isinstance(tensor, torch.Tensor) and not isinstance(tensor, nn.Parameter) and id(tensor) not in seen:
                seen.add(id(tensor))
                scope = next((b for b in blocks if path == b or path.startswith(f"{b}.")), "")
                found[scope] += local_tensor_bytes(tensor)
    return found


def scale_blocks(values: Counter, lengths: dict[str, int]) -> Counter:
    """`values` by scope with each list's first block counted `lengths[list]` times, or a block counted
    `lengths[block scope]` times where that is given (a cut to one block per kind, `fit/kinds.py`).

    e.g. lengths {"transformer_blocks": 19}: values {"": a, "transformer_blocks.0": b} -> a + 19 b;
    lengths {"blocks.0": 3, "blocks.1": 29}: values {"blocks.0": b, "blocks.1": c} -> 3 b + 29 c.
    """
    scaled = Counter()
    for scope, value in values.items():
        scaled[scope] += value * block_weight(scope, lengths)
    return scaled


def block_weight(scope: str, lengths: dict[str, int]) -> int:
    """How many blocks the traced block `scope` stands for under `lengths` (`scale_blocks`); 1 outside the lists."""
    if not scope:
        return 1
    return lengths[scope] if scope in lengths else lengths.get(scope.rpartition(".")[0], 1)


def scale_collectives(records: list, lengths: dict[str, int]) -> list:
    """`CollectiveRecord`s with each traced block's records repeated as often as it stands for (`block_weight`)."""
    scaled = []
    for record in records:
        scaled += [record] * block_weight(record.scope, lengths)
    return scaled


def expand_blocks(trace: Trace, lengths: dict[str, int]) -> Trace:
    """A trace of a forward cut to one block per list (`truncate_blocks`) as the whole forward's: every record of
    `list.0` repeated for `list.1` ... `list.(n-1)` (collectives, kernels, FLOPs); the peak and the output stay.
    Exact for stacks of alike blocks (`forward.alike_blocks`)."""

    def scopes(scope: str) -> list[str]:
        parent = scope.rpartition(".")[0]
        if not scope or parent not in lengths:
            return [scope]
        return [f"{parent}.{i}" for i in range(lengths[parent])]

    whole = dataclasses.replace(trace, flops=Counter(), fp32_flops=Counter(), kernels=Counter(), collectives=[])
    for source, target in ((trace.flops, whole.flops), (trace.fp32_flops, whole.fp32_flops)):
        for scope, value in source.items():
            target.update(dict.fromkeys(scopes(scope), value))
    for (scope, kind, name), count in trace.kernels.items():
        whole.kernels.update({(s, kind, name): count for s in scopes(scope)})
    for record in trace.collectives:
        whole.collectives += [record._replace(scope=s) for s in scopes(record.scope)]
    whole.collectives.sort(key=lambda r: _block_order(r.scope))
    return whole


def _block_order(scope: str) -> tuple:
    parent, _, index = scope.rpartition(".")
    return (parent, int(index)) if index.isdigit() else (scope, -1)


# ---------------------------------------------------------------------------------------------
# fake tensors


@contextlib.contextmanager
def fake_mode():
    """A `FakeTensorMode` that accepts meta tensors built before it (they become fake on use)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


def to_fake(model: nn.Module, device: str = FAKE_DEVICE) -> nn.Module:
    """Inside `fake_mode()`: every parameter and buffer of a meta model becomes a fake tensor on `device` (cpu, or
    cuda: then no parameter requires grad, as a fake CUDA leaf that does aborts the process in autograd).

    Tied parameters stay one parameter: each holder gets its own new tensor (a fake tensor cannot take a meta
    tensor's place in place), which would count T5's tied table (`shared` = `encoder.embed_tokens`,
    UMT5-XXL's: 2.1 GB in bf16) twice, so every later holder is pointed at the first one's new tensor again.
    Each new tensor is made from its shape alone (`torch.empty_strided`, a DTensor around a new local shard with the
    old spec): `to_empty`'s `empty_like` turns each meta tensor into a fake one first and, on a DTensor, dispatches
    through DTensor too, 2.7 s / 3.4 s for FLUX.1-dev whole / at tp=8 where this takes 0.6 s (`dtp check`'s time).
    """
    tied = _tied_holders(model)
    if device != "cpu":
        model.requires_grad_(False)
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                module._parameters[name] = _empty(param, parameter=True, device=device)
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = _empty(buffer, parameter=False, device=device)
    for (first, first_name), *others in tied:
        for module, name in others:
            setattr(module, name, getattr(first, first_name))
    return model


def _empty(tensor: torch.Tensor, *, parameter: bool, device: str = FAKE_DEVICE) -> torch.Tensor:
    """A new fake `device` tensor like `tensor` (a meta tensor, a DTensor of one, or another subclass: `empty_like`)."""
    if isinstance(tensor, DTensor):
        local = tensor._local_tensor
        new = torch.empty_strided(local.shape, local.stride(), dtype=local.dtype, device=device)
        made = DTensor(new, tensor._spec, requires_grad=tensor.requires_grad and device == "cpu")
        if parameter:  # what `nn.Parameter(made)` does for a tensor subclass, without its dispatched `detach`
            made._is_param = True
        return made
    if type(tensor) in (torch.Tensor, nn.Parameter):
        new = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=device)
    else:
        new = torch.empty_like(tensor, device=device)
    requires_grad = tensor.requires_grad and device == "cpu"  # a fake CUDA leaf that requires grad aborts autograd
    return nn.Parameter(new, requires_grad) if parameter else new


def _tied_holders(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """[(module, parameter name), ...] for each parameter that more than one module holds."""
    holders: dict[int, list] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, name))
    return [places for places in holders.values() if len(places) > 1]


def fake_like(value, device: str = FAKE_DEVICE):
    """Inside `fake_mode()`: a tensor (or list of them) as a fake tensor on `device` of the same shape and dtype."""
    if isinstance(value, list):
        return [fake_like(v, device) for v in value]
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device=device)
    return value


def trace_call(
    model: nn.Module, call, inputs: dict, repeated: tuple[str, ...] = (), device: str = FAKE_DEVICE
) -> Trace:
    """Run `call(model, **inputs)` under `PhaseTrace` (no grad); the model and inputs must be fake already (on
    `device`: "cuda" adds `cuda.CudaRoute`). `repeated`: paths of submodules called many times alike (Wan's VAE
    decoder, once per latent frame), whose repeats are replayed rather than run (`repeats.py`; the same figures)."""
    resident = [*model.parameters(), *model.buffers(), *(t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))]
    masks = [v for k, v in inputs.items() if "mask" in k and isinstance(v, torch.Tensor)]  # 0 / 1 (`bounds.py`)
    with torch.no_grad(), PhaseTrace(model, resident, masks) as tracer, contextlib.ExitStack() as stack:
        tracer.trace.device = device
        if device == "cuda":
            stack.enter_context(CudaRoute())
        let_flex_attention_through(PhaseTrace)  # flex (Kandinsky 6 SR's NABLA) runs below the tracer, uncounted
        stack.enter_context(eager_flex_attention())
        for path in repeated:
            stack.enter_context(repeated_calls(tracer, model.get_submodule(path)))
        stack.enter_context(tracer.tensors.modules(model))
        out = call(model, **inputs)
        tracer.trace.output_bytes = sum(t.numel() * t.element_size() for t in leaves(out))
        del out
    tracer.trace.at_peak, tracer.trace.made = tracer.tensors.at_peak, frozenset(tracer.tensors.made)
    return tracer.trace
