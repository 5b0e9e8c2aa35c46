"""Forward hooks that cut planned tensors into this rank's sequence chunk and gather outputs back.

Inputs are matched by forward() parameter name whether they arrive positionally or by keyword
(Z-Image calls its blocks positionally, Flux by keyword), so the hook binds them to the signature.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ...errors import ForwardError
from ...plan.cp import GatherRule, SplitRule
from .sequence import gather_chunks, local_chunk


class SplitInputs:
    """Pre-hook: replace the named inputs of one module by their local chunks (None inputs pass)."""

    def __init__(self, path: str, module: nn.Module, rules: list[SplitRule], rank: int, cp: int):
        self.path, self.rules, self.rank, self.cp = path, rules, rank, cp
        self.signature = inspect.signature(module.forward)

    def __call__(self, module, args, kwargs):
        bound = self.signature.bind(*args, **kwargs)
        for rule in self.rules:
            value = bound.arguments.get(rule.name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise ForwardError(
                    f"cp split of input '{rule.name}' of '{self.path or '<model>'}': got a "
                    f"{type(value).__name__}, not a tensor."
                )
            what = f"input '{rule.name}' of '{self.path or '<model>'}'"
            bound.arguments[rule.name] = local_chunk(value, rule.dim, self.rank, self.cp, what, rule.expected_dims)
        return bound.args, bound.kwargs


class SplitOutputs:
    """Forward hook: replace elements of the module's output (index 0 of a bare tensor) by local chunks."""

    def __init__(self, path: str, rules: list[SplitRule], rank: int, cp: int):
        self.path, self.rules, self.rank, self.cp = path, rules, rank, cp

    def __call__(self, module, args, output):
        single = isinstance(output, torch.Tensor)
        items = [output] if single else list(output)
        for rule in self.rules:
            if rule.name >= len(items) or not isinstance(items[rule.name], torch.Tensor):
                raise ForwardError(
                    f"cp split of output {rule.name} of '{self.path}': the module returned "
                    f"{len(items)} item(s) and element {rule.name} is not a tensor."
                )
            what = f"output {rule.name} of '{self.path}'"
            items[rule.name] = local_chunk(items[rule.name], rule.dim, self.rank, self.cp, what, rule.expected_dims)
        return items[0] if single else type(output)(items)


class GatherOutput:
    """Forward hook: all-gather the module's output tensor on the `cp` group, in rank order."""

    def __init__(self, path: str, rule: GatherRule, group):
        self.path, self.rule, self.group = path, rule, group

    def __call__(self, module, args, output):
        if not isinstance(output, torch.Tensor):
            raise ForwardError(
                f"cp gather at '{self.path}': the module returned a {type(output).__name__}, not a tensor."
            )
        return gather_chunks(output, self.rule.dim, self.group, f"output of '{self.path}'", self.rule.expected_dims)
