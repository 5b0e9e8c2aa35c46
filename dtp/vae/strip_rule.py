"""`StripRule`: how one kind of VAE layer runs on row strips; `VaeParallel`: what one parallel VAE installed.

A rule answers five questions about a layer, each a small function (the defaults: nothing to say):

    matches(module) -> bool          is this layer of my kind?
    check(module, path)              raise PlanError (naming `path`) when this instance has no exact strip rule
    install(module, state)           make it run on strips: `state.replace(...)` / `state.hooks(...)`; None when
                                     the layer is row-local (each output row needs only its own input rows)
    owns(module) -> tuple[str, ...]  child paths whose descendants this rule covers (not visited); "" = all
    height_stride(module) -> int     the factor by which it divides the height (the encoder's input is split in
                                     multiples of the product over every layer)

The family modules (`image.py`, `wan_qwen.py`, `hunyuan.py`, `ltx.py`, `ltx2.py`, `hunyuan15.py`, `hunyuan_image.py`,
`minimax.py`, `dc.py`, `cogvideox.py`, `magvit.py`, `mochi.py`, `cosmos.py`) each hold a tuple of rules;
`strip_rules.py` puts them in one table, first match wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..errors import PlanError
from .split import Split


def _no_check(module: nn.Module, path: str) -> None:
    return None


def _owns_nothing(module: nn.Module) -> tuple[str, ...]:
    return ()


def _stride_one(module: nn.Module) -> int:
    return 1


@dataclass(frozen=True)
class StripRule:
    """One row of the VAE rule table (see the module docstring for the five functions)."""

    name: str
    matches: Callable[[nn.Module], bool]
    check: Callable[[nn.Module, str], None] = _no_check
    install: Callable[[nn.Module, VaeParallel], None] | None = None
    owns: Callable[[nn.Module], tuple[str, ...]] = _owns_nothing
    height_stride: Callable[[nn.Module], int] = _stride_one


@dataclass
class VaeParallel:
    """What `parallelize_vae` installed on one VAE, to run it and to undo it."""

    split: Split
    gather_output: bool
    undo: list = field(default_factory=list)

    def replace(self, module: nn.Module, forward, *, name: str = "forward") -> None:
        """`module.<name> = forward` on the instance (the class's method untouched), undone by `undo`."""
        assert name not in module.__dict__, f"{type(module).__name__} already has an instance {name}"
        setattr(module, name, forward)
        self.undo.append(lambda: module.__dict__.pop(name, None))

    def hooks(self, handles) -> None:
        """Hook handles to remove on undo."""
        self.undo.extend(handle.remove for handle in handles)


def by_class_name(*names: str) -> Callable[[nn.Module], bool]:
    """A `matches` for layers named by class (diffusers' VAE layers are matched by name: no import needed)."""
    return lambda module: type(module).__name__ in names


def named_rule(class_name: str, reason: Callable[[nn.Module], str | None] | None = None, **fields) -> StripRule:
    """The rule of diffusers' layer class `class_name` (matched by name), refused where `reason(module)` says why
    (`reason_check`; None: every instance has a rule); `fields`: the rule's install / owns / height_stride."""
    check = _no_check if reason is None else reason_check(reason)
    return StripRule(class_name, by_class_name(class_name), check, **fields)


def reason_check(reason: Callable[[nn.Module], str | None]) -> Callable[[nn.Module, str], None]:
    """A `check` from a function that says why a layer has no strip rule (None: it has one)."""

    def check(module: nn.Module, path: str) -> None:
        why = reason(module)
        if why is not None:
            raise PlanError(f"parallelize_vae: {path} ({type(module).__name__}) has no row-strip rule for {why}.")

    return check
