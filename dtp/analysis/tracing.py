"""One traced forward, shared by `lint` and `suggest`: module hooks on every module, tags on tensors.

A tracer (lint's `Tracer`, suggest's `FlowTracer`) has `enter(path, module, args)` and `leave(path, module,
output)`, called at every module boundary, and `on_function(func, args, kwargs, out)`, called by `TagMode` for
every torch function inside. Tags are dicts stored on tensors under `TAG` ({source Linear path: feature span});
`traced_forward` removes every hook and every tag left on parameters and buffers when the forward ends.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

TAG = "_dtp_trace_tag"  # attribute on traced tensors: {source path: (start, stop) or None}
# torch functions and Tensor methods of the form f(x, sizes_or_count, dim=0) that cut x into pieces.
SPLITS = {"chunk", "split", "tensor_split", "split_with_sizes"}


@torch.no_grad()
def traced_forward(model: nn.Module, inputs: dict, tracer):
    """`model(**inputs)` with `tracer` called at every module boundary and every torch function; the output."""
    handles = []
    for path, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda m, a, p=path: tracer.enter(p, m, a)))
        handles.append(module.register_forward_hook(lambda m, a, o, p=path: tracer.leave(p, m, o)))
    try:
        with eager_flex_attention(), TagMode(tracer):
            return model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
        for tensor in [*model.parameters(), *model.buffers()]:  # a tag must not outlive the trace
            tensor.__dict__.pop(TAG, None)


@contextmanager
def eager_flex_attention():
    """Flex attention called as its plain higher-order op for the duration, not through torch.compile.

    torch 2.13 runs flex attention outside a compiled region (Kandinsky 6 SR's NABLA attention) as
    torch.compile(fullgraph=True) of its op: dynamo then traces the tracer's `TagMode` and fails, and it refuses a
    Python dispatch mode (the collective counter) outright. torch's debug switch calls the op directly: the same
    dense math, no compile (its note on wrong results concerns the backward and the lse statistics, not the output)."""
    import torch.nn.attention.flex_attention as flex

    before = flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        yield
    finally:
        flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = before


def tag_of(tensor) -> dict:
    return getattr(tensor, TAG, None) or {} if isinstance(tensor, torch.Tensor) else {}


def set_tag(tensor, tag: dict) -> None:
    setattr(tensor, TAG, dict(tag))


class TagMode(TorchFunctionMode):
    """Passes every torch function's result to the tracer's `on_function` (the mode is off inside it)."""

    def __init__(self, tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.tracer.on_function(func, args, kwargs, out)
        return out


def union(tags: list[dict]) -> dict:
    merged: dict = {}
    for tag in tags:
        for source, span in tag.items():
            merged[source] = span if merged.get(source, span) == span else None
    return merged


def feature_slice_start(func, args) -> int | None:
    """For `x[..., a:b]` (a step-1 slice of the last dim, everything else whole), `a`; else None."""
    if getattr(func, "__name__", "") != "__getitem__" or len(args) != 2 or not isinstance(args[0], torch.Tensor):
        return None
    x, index = args
    index = index if isinstance(index, tuple) else (index,)
    last = index[-1] if index else None
    leading = index[:-1]
    whole = all(i is Ellipsis or (isinstance(i, slice) and i == slice(None)) for i in leading)
    reaches_last = any(i is Ellipsis for i in leading) or len(index) == x.dim()
    if not (isinstance(last, slice) and whole and reaches_last and last.step in (None, 1)):
        return None
    return last.indices(x.shape[-1])[0]


def on_last_dim(args, kwargs, position: int) -> bool:
    """Whether the `dim` argument (keyword, or positional at `position`, default 0) is the last dim of args[0]."""
    x = args[0]
    dim = kwargs.get("dim", args[position] if len(args) > position else 0)
    return isinstance(x, torch.Tensor) and x.dim() > 0 and isinstance(dim, int) and dim % x.dim() == x.dim() - 1


def is_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)) or (
        name.endswith(("RMSNorm", "LayerNorm")) and not name.startswith("Ada")
    )


def head_dim_of(model: nn.Module, path: str) -> int | None:
    module = model.get_submodule(path)
    for attr in ("head_dim", "dim_head", "attention_head_dim"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    inner, heads = getattr(module, "inner_dim", None), getattr(module, "heads", None)
    return inner // heads if isinstance(inner, int) and isinstance(heads, int) and heads else None
