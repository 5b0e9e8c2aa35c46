"""Inputs and outputs of a transformer call as trees: tensors at the leaves of tuples, lists and dicts.

The cfg wrapper compares a call's inputs with a predicted call (`same`), keeps copies of them
(`snapshot`), finds the arguments in which two calls differ (`differences`), and moves output
tensors through one exchange (`leaves` / `rebuild`). diffusers' output classes (`BaseOutput`) are
dicts and rebuild as their own type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch


def map_tensors(value, fn: Callable[[torch.Tensor], object]):
    """`value` with every tensor leaf replaced by `fn(leaf)`; containers rebuilt as their own type."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        mapped = {key: map_tensors(item, fn) for key, item in value.items()}
        return type(value)(**mapped) if _is_output_class(value) else type(value)(mapped)
    if isinstance(value, (tuple, list)):
        items = [map_tensors(item, fn) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


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


def snapshot(value):
    """A copy of `value` whose tensors the caller cannot change in place afterwards."""
    return map_tensors(value, lambda t: t.detach().clone())


def same(a, b) -> bool:
    """Exactly equal trees: tensors of the same shape, dtype and values; other leaves by ==."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
            and torch.equal(a, b)
        )
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (
            isinstance(a, Mapping)
            and isinstance(b, Mapping)
            and a.keys() == b.keys()
            and all(same(a[k], b[k]) for k in a)
        )
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value: equal only to itself
        return a is b


def differences(before: Mapping, after: Mapping) -> dict:
    """`{name: after[name]}` for every argument whose value is not `same` in the two calls."""
    names = dict.fromkeys([*before, *after])
    return {name: after.get(name) for name in names if not same(before.get(name), after.get(name))}
