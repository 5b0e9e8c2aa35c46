"""Worker side of test_dits_parity.py: the DiT classes planned in issue 45's round (OmniGen), at tp=2 against one
process, and the negative control of the mechanism each needed."""

from __future__ import annotations

from functools import partial
from unittest import mock

import dtp
from dtp.resolve import clear_caches
from dtp.testing.parity import forward_parity
from dtp.testing.tiny import PLAN_CLASSES, tiny_inputs, tiny_model

BATCH = 2


def _parity(name: str, mesh) -> float:
    cls = PLAN_CLASSES[name]
    return forward_parity(partial(tiny_model, cls), tiny_inputs(cls, batch=BATCH), mesh, dtp.load_plan(name)).relative


def _outcome(name: str, mesh) -> str:
    try:
        relative = _parity(name, mesh)
    except dtp.PlanError as exc:
        return f"PlanError: {exc}"
    except RuntimeError as exc:
        return f"crash: {exc}"
    return f"ran: {relative:.2g}"


def run_dits(rank, world_size):
    mesh = dtp.make_mesh(tp=world_size)
    results = {"omnigen": _parity("omnigen", mesh)}
    clear_caches()  # the control must not be answered by the memo of the accepted plan
    with mock.patch("dtp.resolve.binding.heads._head_wide_out_dim", lambda module: ()):
        results["omnigen/out_dim_global"] = _outcome("omnigen", mesh)
    clear_caches()
    return results
