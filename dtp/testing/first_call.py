"""The positional arguments a module is first called with in a run, the run stopped there (test fixture): what a
forward hands its first block, without running the blocks."""

from __future__ import annotations

import torch
from torch import nn


class _Stop(Exception):
    """Raised by the pre-hook at the module's first call: the rest of the run is not under test."""


def first_call_args(module: nn.Module, run) -> tuple:
    """`args` of `module`'s first call inside `run()` (no grad); `run` stops there. AssertionError if never called."""
    seen = {}

    def stop(_module, args):
        seen["args"] = args
        raise _Stop

    handle = module.register_forward_pre_hook(stop)
    try:
        with torch.no_grad():
            run()
    except _Stop:
        return seen["args"]
    finally:
        handle.remove()
    raise AssertionError(f"{type(module).__name__} was never called")
