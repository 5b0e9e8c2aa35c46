"""Inputs and outputs of a transformer call as trees: tensors at the leaves of tuples, lists and dicts.

The cfg wrapper keeps the calls it has seen (`hold`: each tensor as the object and its version counter, no
copy), compares a new call with a held one (`matches`), finds the arguments in which two calls differ
(`differences`), and moves output tensors through one exchange (`leaves` / `rebuild`). diffusers' output
classes (`BaseOutput`) are dicts and rebuild as their own type.

A tensor matches a held one without reading a value when it is the same object, or the same view (same base,
offset, strides, shape and dtype), at the same version: diffusers' pipelines pass the same latents and prompt
embeddings to both calls of a step; dtp's CP hooks, which run before the cfg wrapper, cut them with `narrow`
(a new view of the same memory per call); an in-place change of a tensor or of its base bumps the `_version`
they share. A different object of the same shape, dtype and device is compared by value only where the caller
allows it (`values=True`), because on a GPU that read waits for every queued kernel:

    held: {"hidden_states": Held(L, v3), "timestep": Held(T, v0)}
    call: {"hidden_states": L (v3),      "timestep": T2}      L: identity; T2: torch.equal(T2, T) if values, else no
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class Held:
    """A tensor as the wrapper saw it: the object (no copy) and its version counter then."""

    tensor: torch.Tensor
    version: int

    def unchanged(self) -> bool:
        return self.tensor._version == self.version


def map_tensors(value, fn: Callable[[torch.Tensor], object], kind: type = torch.Tensor):
    """`value` with every leaf of type `kind` replaced by `fn(leaf)`; containers rebuilt as their own type."""
    if isinstance(value, kind):
        return fn(value)
    if value is None or type(value) in _SCALARS:  # the common leaves, before the (slower) ABC check below
        return value
    if isinstance(value, (tuple, list)):
        items = [map_tensors(item, fn, kind) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, Mapping):
        mapped = {key: map_tensors(item, fn, kind) for key, item in value.items()}
        return type(value)(**mapped) if _is_output_class(value) else type(value)(mapped)
    return value


_SCALARS = (bool, int, float, str)  # exact types: never a container, never a tensor (a subclass goes the long way)


def _is_output_class(value) -> bool:
    """diffusers' BaseOutput (an OrderedDict dataclass): built from keywords, not from a dict."""
    return type(value) not in (dict,) and hasattr(value, "__dataclass_fields__")


def leaves(value) -> list[torch.Tensor]:
    """The tensor leaves of `value`, in the order `rebuild` consumes them."""
    found: list[torch.Tensor] = []
    map_tensors(value, lambda t: found.append(t) or t)
    return found


def rebuild(value, new_leaves: list[torch.Tensor]):
    """`value` with its tensor leaves replaced, in order, by `new_leaves`."""
    it = iter(new_leaves)
    out = map_tensors(value, lambda _: next(it))
    assert next(it, None) is None, "more leaves than tensors in the tree"
    return out


def hold(value):
    """`value` with each tensor as a `Held` (the object and its version now): no copy, no device work."""
    return map_tensors(value, lambda t: Held(t, t._version))


def release(held):
    """The values a held tree stands for (its tensors as the objects held)."""
    return map_tensors(held, lambda h: h.tensor, Held)


def matches(value, held, *, values: bool) -> bool:
    """Whether `value` equals what `held` held (see the module docstring): identity and version, else shapes and,
    with `values`, the elements (a host read); other leaves by ==."""
    if isinstance(held, Held):
        return isinstance(value, torch.Tensor) and held.unchanged() and _same_tensor(value, held.tensor, values)
    if isinstance(value, torch.Tensor):
        return False
    if isinstance(value, Mapping) or isinstance(held, Mapping):
        return (
            isinstance(value, Mapping)
            and isinstance(held, Mapping)
            and value.keys() == held.keys()
            and all(matches(value[k], held[k], values=values) for k in value)
        )
    if isinstance(value, (tuple, list)) or isinstance(held, (tuple, list)):
        return (
            type(value) is type(held)
            and len(value) == len(held)
            and all(matches(x, y, values=values) for x, y in zip(value, held))
        )
    return same_object(value, held)


def _same_tensor(a: torch.Tensor, b: torch.Tensor, values: bool) -> bool:
    alike = a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
    return a is b or (alike and (same_view(a, b) or (values and torch.equal(a, b))))


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two views of the same memory: the same base, offset and strides (shape and dtype checked by the caller)."""
    return (
        a._base is not None
        and a._base is b._base
        and a.storage_offset() == b.storage_offset()
        and a.stride() == b.stride()
    )


def same_object(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value: equal only to itself
        return a is b


def same(a, b) -> bool:
    """Exactly equal trees: tensors of the same shape, dtype and values; other leaves by ==."""
    return matches(a, hold(b), values=True)


def differences(before: Mapping, after: Mapping) -> dict:
    """`{name: after[name]}` for every argument of `after` (a call) whose value is not the one `before` (a held
    call) had, compared by value (the timestep a pipeline computes anew for each call is not a difference)."""
    names = dict.fromkeys([*before, *after])
    return {name: after.get(name) for name in names if not matches(after.get(name), before.get(name), values=True)}
