"""A transformer call's passed arguments by name, and the call made again from them, without `inspect.Signature`'s
`bind` / `BoundArguments.args` on every call.

The cfg wrapper sees every transformer call of a generation (two or more a step) and works on its arguments by name.
`Signature.bind` and rebuilding `(args, kwargs)` from a `BoundArguments` cost tens of µs of host a call; a table of
the forward's parameters built once makes the same dict in a few. The dict is exactly `bind(...).arguments`: the
passed arguments only (no defaults), in the order of the signature. A call the table cannot vouch for (a parameter
`*args` / `**kwargs` / positional-only, a name the forward lacks, an argument passed twice, a required one missing)
goes through `bind`, which also raises its TypeError. Example: `forward(hidden_states, timestep=None,
encoder_hidden_states=None, return_dict=True)` called `(x, encoder_hidden_states=e, timestep=t)` gives
`{"hidden_states": x, "timestep": t, "encoder_hidden_states": e}`, and `call(forward, that)` is
`forward(hidden_states=x, timestep=t, encoder_hidden_states=e)`.
"""

from __future__ import annotations

import inspect

BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class CallTable:
    """The parameters of one forward, read once from its signature."""

    def __init__(self, signature: inspect.Signature):
        params = list(signature.parameters.values())
        self.signature = signature
        self.names = tuple(p.name for p in params)
        self.known = frozenset(self.names)
        self.positional = tuple(p.name for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.required = tuple(p.name for p in params if p.default is inspect.Parameter.empty)
        self.by_name = all(p.kind in BY_NAME for p in params)  # every argument can be passed by keyword

    def arguments(self, args: tuple, kwargs: dict) -> dict:
        """`signature.bind(*args, **kwargs).arguments` as a dict (module docstring)."""
        if self.by_name and len(args) <= len(self.positional) and kwargs.keys() <= self.known:
            passed = dict(zip(self.positional, args))
            if not any(name in passed for name in kwargs) and all(
                name in passed or name in kwargs for name in self.required
            ):
                if not kwargs:
                    return passed
                passed.update(kwargs)
                return {name: passed[name] for name in self.names if name in passed}
        return dict(self.signature.bind(*args, **kwargs).arguments)

    def call(self, fn, arguments: dict):
        """`fn` called with `arguments` (names of this signature): by keyword, or as `bind_partial` lays them out."""
        if self.by_name:
            return fn(**arguments)
        bound = self.signature.bind_partial()
        bound.arguments.update(arguments)
        return fn(*bound.args, **bound.kwargs)
