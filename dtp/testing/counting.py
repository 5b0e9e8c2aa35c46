"""Calls of a module-level function counted inside a `with` block: the proof, in a parity test, that a code path
really ran (Ulysses' all-to-all, the ring's blocks), not only that the output matched.

    with CallCounter(ring_module, "block_attention") as blocks, CallCounter(ulysses_module, "to_heads") as a2a:
        out = model(**inputs)
    assert blocks.calls > 0 and a2a.calls > 0
"""

from __future__ import annotations


class CallCounter:
    """`module.name` replaced by a counting wrapper for the block (callers that look it up at call time go
    through it), restored on exit; `calls` is how many times it ran."""

    def __init__(self, module, name: str):
        self.module, self.name, self.calls = module, name, 0
        self.original = getattr(module, name)

    def __enter__(self) -> CallCounter:
        def counted(*args, **kwargs):
            self.calls += 1
            return self.original(*args, **kwargs)

        setattr(self.module, self.name, counted)
        return self

    def __exit__(self, *exc) -> None:
        setattr(self.module, self.name, self.original)
