"""Meta tensors that carry their values where they are known: the flow check for forwards with data-dependent shapes.

Four DiTs cannot run a forward on plain meta tensors, because a shape inside it depends on a value:

    Lumina2       `attention_mask.sum(dim=1).tolist()`: the caption lengths
    Qwen-Image 2.1 `torch.repeat_interleave(img_mask[0], repeats)`, `image_pad_mask.nonzero()`, `.tolist()`
    HiDream       `flat_expert_indices.bincount().cpu().numpy()`: tokens per MoE expert
    Mochi         `torch.autocast(freqs.device.type, ...)`: autocast does not know the device "meta"

The values those shapes come from are the example inputs (masks, ids, sizes), never the weights. So
`values_run()` runs the forward on meta tensors as before, but every meta tensor computed from inputs
and factory calls alone carries its value, a small CPU tensor computed alongside (`KnownValues`):

    known op      all meta arguments carry values -> the op runs on the values (CPU), the result is a
                  meta tensor of its shape carrying it; `.tolist()`, `.item()`, `.cpu()` return the values
    unknown op    some meta argument is a weight or an activation -> the op runs on meta as always; a known
                  bool index becomes its long indices, a known `repeats` gives `output_size`; a known tensor
                  written with unknown data (and its views) loses its value
    routing       a mixture-of-experts layer routes tokens by the activations (unknown): every expert runs on
                  every token (`moe_infer` replaced on the meta copy), so every expert's shapes are checked
    autocast      `torch.autocast("meta", ...)` is a no-op (shapes do not depend on it)
    data          `torch.tensor(data, device="meta")` carries `data`

Exact for shapes: a value is only used where it is known exactly. Example (Qwen-Image 2.1, img_mask
[F, T, T], 4 latent tokens per image slot): repeats = where(img_mask, 4, 1) = [1, 4, 4] is known,
repeat_interleave(joint, repeats, dim=1) on the meta activation gets output_size 9.
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten
_INDEXED = (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)
_REPEATS = (aten.repeat_interleave.Tensor,)


class _Value:
    """A meta tensor's value (a CPU tensor) and its storage's validity, shared with every view of that storage."""

    def __init__(self, value: torch.Tensor, root: list[bool]):
        self.value, self.root = value, root


def _value_of(t) -> torch.Tensor | None:
    known = getattr(t, "_dtp_value", None)
    return known.value if known is not None and known.root[0] else None


def attach(meta: torch.Tensor, value: torch.Tensor, root: list[bool] | None = None) -> torch.Tensor:
    """Let `meta` carry `value` (same shape; a CPU tensor)."""
    meta._dtp_value = _Value(value, root if root is not None else [True])
    return meta


def _is_meta(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


class KnownValues(TorchDispatchMode):
    """Meta ops that compute values alongside, where every meta argument has one (see the module docstring)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        metas = [t for t in tree_leaves((args, kwargs)) if _is_meta(t)]
        meta_device = any(isinstance(v, torch.device) and v.type == "meta" for v in kwargs.values())
        if (metas or meta_device) and all(_value_of(t) is not None for t in metas):
            return self._known(func, args, kwargs)
        self._forget_written(func, args, kwargs)
        args, kwargs = _with_known_sizes(func, args, kwargs)
        return func(*args, **kwargs)

    def _known(self, func, args, kwargs):
        """The op on the values; tensor results: meta tensors carrying them (an argument's value: the argument)."""
        to_device = kwargs.get("device")
        stays_real = isinstance(to_device, torch.device) and to_device.type != "meta"
        owners = {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                owners[id(_value_of(t) if _is_meta(t) else t)] = t

        def real(x):
            if _is_meta(x):
                return _value_of(x)
            return torch.device("cpu") if isinstance(x, torch.device) and x.type == "meta" else x

        out = func(*tree_map(real, args), **tree_map(real, kwargs))
        if stays_real or not isinstance(out, (torch.Tensor, tuple, list)):
            return out  # `.cpu()`, `.item()` (a Python number), a size

        def wrap(r):
            if not isinstance(r, torch.Tensor):
                return r
            if id(r) in owners:  # in-place or out=: the argument itself, its value updated
                return owners[id(r)]
            meta = torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device="meta")
            return attach(meta, r, _root_sharing(r, owners.values()))

        return tree_map(wrap, out)

    @staticmethod
    def _forget_written(func, args, kwargs) -> None:
        """A known tensor the op writes unknown data into (and every view of its storage) loses its value."""
        schema = func._schema
        for i, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            target = args[i] if i < len(args) else kwargs.get(argument.name)
            for t in tree_leaves(target):
                if getattr(t, "_dtp_value", None) is not None:
                    t._dtp_value.root[0] = False


def _check_broadcast(value: tuple, target: tuple) -> None:
    """The real kernel's error when `value` does not broadcast to the indexed shape `target`."""
    try:
        fits = tuple(torch.broadcast_shapes(value, target)) == target
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(value)} cannot be broadcast to indexing result of shape "
            f"{list(target)}"
        )


def _root_sharing(r: torch.Tensor, arguments) -> list[bool] | None:
    """The validity flag of the argument whose value `r` is a view of (None: `r` owns new storage)."""
    for t in arguments:
        known = getattr(t, "_dtp_value", None)
        if known is not None and known.value.untyped_storage().data_ptr() == r.untyped_storage().data_ptr():
            return known.root
    return None


def _with_known_sizes(func, args, kwargs):
    """The meta kernel's missing values, where known: bool indices -> long indices, `repeats` -> `output_size`."""
    if func in _INDEXED:
        args = (args[0], [_long_indices(i) for i in args[1]], *args[2:])
        args = (args[0], [j for i in args[1] for j in (i if isinstance(i, tuple) else (i,))], *args[2:])
    if func in _REPEATS and kwargs.get("output_size") is None and _value_of(args[0]) is not None:
        kwargs = {**kwargs, "output_size": int(_value_of(args[0]).sum())}
    return args, kwargs


def _long_indices(index):
    """A known bool mask of k dims -> its k long index tensors (meta, with values); anything else unchanged."""
    value = _value_of(index) if _is_meta(index) else None
    if value is None or value.dtype not in (torch.bool, torch.uint8):
        return index
    return tuple(attach(torch.empty(i.shape, dtype=i.dtype, device="meta"), i) for i in value.nonzero(as_tuple=True))


# -- the run -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def values_run(clone: nn.Module, inputs: dict):
    """Inside: `clone`'s forward runs with known values (`inputs`: meta tensors that carry theirs, see `attach`)."""
    _every_expert_routes(clone)
    # StrictIndexPut outside KnownValues: it sees the long indices KnownValues makes of known bool masks
    with _meta_autocast_off(), StrictIndexPut(), KnownValues(), _DataOnMeta():
        yield


def strict_index_put() -> StrictIndexPut:
    """The plain meta run's mode: only the indexed-write check (`StrictIndexPut`)."""
    return StrictIndexPut()


class StrictIndexPut(TorchDispatchMode):
    """`x[index] = value` on meta tensors raises, as on real ones, when `value` does not broadcast to `x[index]`.

    The meta kernel of `index_put_` checks nothing: a sharded activation [B, 16, 16] written into the whole
    [B, 20, 64] sequence (Qwen-Image 2.1, `img_in` colwise) passes on meta and raises on the real forward."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        indices = args[1] if func in _INDEXED[1:] else ()
        # a bool mask's indexed shape is unknown on meta (KnownValues turns known masks into long indices first)
        if indices and _is_meta(args[0]) and all(i is None or (_is_meta(i) and i.dtype == torch.long) for i in indices):
            _check_broadcast(tuple(args[2].shape), tuple(aten.index.Tensor(args[0], args[1]).shape))
        return func(*args, **kwargs)


class _DataOnMeta(TorchFunctionMode):
    """`torch.tensor(data, device="meta")` keeps its data: made on the CPU, then moved (`KnownValues` keeps it)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func in (torch.tensor, torch.as_tensor) and device is not None and torch.device(device).type == "meta":
            return func(*args, **{**kwargs, "device": "cpu"}).to("meta")
        return func(*args, **kwargs)


def _every_expert_routes(clone: nn.Module) -> None:
    """Mixture-of-experts layers of the meta copy send every token to every expert (their routing is unknown)."""
    for module in clone.modules():
        if callable(getattr(module, "moe_infer", None)) and isinstance(getattr(module, "experts", None), nn.ModuleList):
            module.moe_infer = types.MethodType(_moe_every_expert, module)


def _moe_every_expert(self, x: torch.Tensor, flat_expert_indices, flat_expert_weights) -> torch.Tensor:
    """`moe_infer`'s output shape (x's), with every expert run on every token."""
    out = torch.zeros_like(x)
    for expert in self.experts:
        out = out + expert(x)
    return out


@contextlib.contextmanager
def _meta_autocast_off():
    """`torch.autocast("meta", ...)` -> a no-op while the check runs (autocast changes dtypes, not shapes)."""
    original = torch.autocast

    def autocast(device_type, *args, **kwargs):
        return contextlib.nullcontext() if device_type == "meta" else original(device_type, *args, **kwargs)

    torch.autocast = autocast
    try:
        yield
    finally:
        torch.autocast = original
