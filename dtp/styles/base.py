"""The plan vocabulary as classes: one `Style` subclass per plan keyword, registered by name.

A style class says everything dtp needs to know about one way of splitting a module, so that adding a
style is one file plus its `register_style` call (no edits in parse, pairs, padding, LoRA, lint ...):

    name          the plan keyword (`colwise`, `rowwise`, ...)
    kind          how resolve binds it: "linear" (a LinearSpec: weight and bias split by a Layout, hooked by
                  a ParallelStyle), "norm" (`resolve/norms.py`), "output" (`resolve/outputs.py`)
    shard_dim     the weight dim that is split (0: output features / rows, 1: input features / columns)
    role          the pairing role: "colwise" (its output stays sharded: a rowwise layer must consume it),
                  "rowwise" (its input is sharded: a colwise layer must produce it), "whole" (the output
                  leaves whole: pairs with nothing), "table" (norms and output cuts: no pairing)
    packed        the split dim holds several logical blocks, each split on its own (`blocks:` in the plan)
    options       extra keys a plan rule may give (`blocks`, `dim`)
    collective    what the forward issues per call: "all_reduce", "all_gather" or None (lint, dtp check)
    accepts(m)    None when module `m` is a valid target, else the reason it is not (read after "'path' is a X")
    parallel_style(spec, ...)   the torch `ParallelStyle` that shards one resolved module (kind "linear")

Padding (`resolve/padding.py`) follows `shard_dim` and `role`; the LoRA split (`adapters/shard.py`) splits
the adapter factor that meets `shard_dim`. Instances are singletons: `Style("colwise") is Style.COLWISE`.
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import PlanError

_REGISTRY: dict[str, Style] = {}


class _StyleMeta(type):
    """`Style("colwise")` looks a registered style up by name; `for s in Style` lists them all."""

    def __call__(cls, name: str | None = None):
        if cls is Style:
            if name not in _REGISTRY:
                raise ValueError(f"unknown style {name!r}; registered: {', '.join(_REGISTRY)}")
            return _REGISTRY[name]
        return super().__call__()

    def __iter__(cls):
        return iter(list(_REGISTRY.values()))


class Style(metaclass=_StyleMeta):
    """Base of every plan style; see the module docstring for what each attribute means."""

    name: ClassVar[str]
    kind: ClassVar[str] = "linear"
    shard_dim: ClassVar[int] = 0
    role: ClassVar[str] = "colwise"
    packed: ClassVar[bool] = False
    options: ClassVar[frozenset[str]] = frozenset()
    collective: ClassVar[str | None] = None
    # diffusers stores absolute packed block sizes on the Linear under this attribute at __init__
    blocks_attr: ClassVar[str | None] = None

    def accepts(self, module) -> str | None:
        """None when `module` can be split by this style, else why not (a linear style takes an nn.Linear)."""
        from torch import nn

        return (
            None if isinstance(module, nn.Linear) else f"not an nn.Linear; '{self.name}' applies to Linear layers only"
        )

    def parallel_style(self, spec, *, device=None, weights_local: bool = False):
        """The torch ParallelStyle that shards the module `spec` resolved (kind "linear" only)."""
        raise NotImplementedError(f"style '{self.name}' has no ParallelStyle (kind {self.kind})")

    # -- derived views, read across resolve / runtime / analysis --------------------------------------

    @property
    def value(self) -> str:
        """The plan keyword (an enum's `.value`, kept for readers of plans)."""
        return self.name

    @property
    def is_linear(self) -> bool:
        """Resolved as a LinearSpec (a weight split by a Layout), not a norm or an output cut."""
        return self.kind == "linear"

    @property
    def is_norm(self) -> bool:
        return self.kind == "norm"

    @property
    def is_packed(self) -> bool:
        return self.packed

    @property
    def is_embedding(self) -> bool:
        """The target is an nn.Embedding (ids in, rows looked up): the pair rule does not apply."""
        return False

    @property
    def gathers_output(self) -> bool:
        """The output leaves the layer whole (all-gathered or all-reduced), so it pairs with no rowwise layer."""
        return self.role == "whole"

    @property
    def splits_bias(self) -> bool:
        """Colwise biases follow the output features; rowwise biases are added once (by tp rank 0)."""
        return self.shard_dim == 0

    @property
    def lora_split(self) -> str:
        """The LoRA factor that meets the split dim: B ([out, r]) for row splits, A ([r, in]) for column splits."""
        return "lora_B" if self.shard_dim == 0 else "lora_A"

    def __repr__(self) -> str:
        return f"<Style {self.name}>"

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other) -> bool:
        if isinstance(other, str):  # compares like the str enum it replaces: Style.COLWISE == "colwise"
            return self.name == other
        return self is other

    def __hash__(self) -> int:
        return hash(self.name)

    def __reduce__(self):  # pickled by name: the same singleton in every process
        return (Style, (self.name,))


def register_style(style_class: type[Style], constant: str | None = None) -> Style:
    """Register `style_class` under its `name` and return its singleton; `constant` also makes it
    `Style.<constant>` (the built-in styles: `Style.COLWISE`, ...). A name taken by another class is an error."""
    name = style_class.name
    existing = _REGISTRY.get(name)
    if existing is not None and type(existing) is not style_class:
        raise PlanError(f"style '{name}' is already registered by {type(existing).__name__}.")
    style = existing or style_class()
    _REGISTRY[name] = style
    if constant:
        setattr(Style, constant, style)
    return style


def unregister_style(name: str) -> None:
    """Remove a registered style (tests that register a toy style clean up after themselves)."""
    _REGISTRY.pop(name, None)
