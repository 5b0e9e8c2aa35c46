"""A call's arguments by parameter name, without `inspect.Signature.bind` on every call.

Hooks that read or replace a forward's inputs by name (the cp split hooks, the patched attention dispatcher) run on
every call of every layer: `Signature.bind` plus `apply_defaults` cost ~13 µs a call, a lookup in a table built once
~1 µs. A function with `*args` or `**kwargs` among its parameters falls back to `bind` (what lands in them is not a
fixed position). Example: `def f(query, key, value, attn_mask=None, scale=None)` called `f(q, k, v, scale=0.1)`:
`arguments` gives `{"query": q, "key": k, "value": v, "attn_mask": None, "scale": 0.1}`.
"""

from __future__ import annotations

import inspect

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class Binder:
    """The parameters of one function: where each sits, and its default."""

    def __init__(self, fn):
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters.values())
        self.names = tuple(p.name for p in params if p.kind in POSITIONAL)
        self.position = {name: i for i, name in enumerate(self.names)}
        self.defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        self.exact = all(p.kind in POSITIONAL or p.kind == inspect.Parameter.KEYWORD_ONLY for p in params)
        # `get` / `replace` hold for any signature without `*args`: what a `**kwargs` catches is in the call's kwargs
        self.fixed_positions = all(p.kind != inspect.Parameter.VAR_POSITIONAL for p in params)

    def arguments(self, args: tuple, kwargs: dict) -> dict:
        """Every parameter's value in this call (defaults filled in), as `bind(...).apply_defaults()` gives them."""
        if not self.exact or len(args) > len(self.names):
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return dict(bound.arguments)
        arguments = dict(self.defaults)
        arguments.update(zip(self.names, args))
        arguments.update(kwargs)
        return arguments

    def get(self, args: tuple, kwargs: dict, name: str):
        """The value passed for `name` in this call, or None when it was not passed."""
        if name in kwargs:
            return kwargs[name]
        at = self.position.get(name)
        return args[at] if at is not None and at < len(args) else None

    def map_argument(self, args: tuple, kwargs: dict, name: str, fn) -> tuple[tuple, dict]:
        """`(args, kwargs)` with the argument `name` replaced by `fn(value passed, or None)`, where it was passed;
        `bind` only for a signature with `*args` (dynamo cannot trace `bind`: an eager-only path)."""
        if not self.fixed_positions:
            bound = self.signature.bind(*args, **kwargs)
            bound.arguments[name] = fn(bound.arguments.get(name))
            return bound.args, bound.kwargs
        return self.replace(args, kwargs, {name: fn(self.get(args, kwargs, name))})

    def replace(self, args: tuple, kwargs: dict, values: dict) -> tuple[tuple, dict]:
        """`(args, kwargs)` with the passed arguments named in `values` replaced (each where it was passed)."""
        args, kwargs = list(args), dict(kwargs)
        for name, value in values.items():
            at = self.position.get(name)
            if name not in kwargs and at is not None and at < len(args):
                args[at] = value
            else:
                kwargs[name] = value
        return tuple(args), kwargs
