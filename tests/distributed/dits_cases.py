"""Worker side of test_dits_parity.py: the DiT classes planned in issue 45's round (OmniGen) and Sana-Video's Mix-FFN
split by channels, at tp=2 against one process, and the negative control of the mechanism each needed."""

from __future__ import annotations

import dataclasses
from functools import partial
from unittest import mock

import torch

import dtp
from dtp.plan import Rule, Style
from dtp.resolve import clear_caches
from dtp.styles.collectives import all_gather_last
from dtp.testing.parity import forward_parity
from dtp.testing.tiny import PLAN_CLASSES, tiny_inputs, tiny_model

BATCH = 2


def _parity(name: str, mesh, plan=None) -> float:
    cls = PLAN_CLASSES[name]
    plan = plan or dtp.load_plan(name)
    return forward_parity(partial(tiny_model, cls), tiny_inputs(cls, batch=BATCH), mesh, plan).relative


def _unpacked_mix_ffn_plan():
    """Sana-Video's plan with the Mix-FFN's [value | gate] channels split as one block (a plausible slip: conv_inverted
    conv_colwise, conv_depth blocks [1]): rank 0 then holds values only, and the forward's chunk(2) pairs values with
    values. The pair rule refuses it (conv_point's width matches no colwise block)."""
    plan = dtp.load_plan("sana_video")
    prefix = "transformer_blocks.*.ff."
    swap = {
        f"{prefix}conv_inverted": Rule(f"{prefix}conv_inverted", Style("conv_colwise")),
        f"{prefix}conv_depth": Rule(f"{prefix}conv_depth", Style("conv_depthwise"), blocks=(1,)),
    }
    return dataclasses.replace(plan, rules=tuple(swap.get(r.key, r) for r in plan.rules))


def _reversed_gather(tensor, group, size):
    """Negative control: conv_temp's channels gathered in reverse rank order (a wrong concatenation)."""
    pieces = all_gather_last(tensor.movedim(1, -1), group, size).movedim(-1, 1).chunk(size, dim=1)
    return torch.cat(pieces[::-1], dim=1)


def _outcome(name: str, mesh) -> str:
    return _outcome_of(lambda: _parity(name, mesh))


def _outcome_of(run) -> str:
    try:
        relative = run()
    except dtp.PlanError as exc:
        return f"PlanError: {exc}"
    except RuntimeError as exc:
        return f"crash: {exc}"
    return f"ran: {relative:.2g}"


def run_dits(rank, world_size):
    mesh = dtp.make_mesh(tp=world_size)
    results = {"omnigen": _parity("omnigen", mesh), "sana_video": _parity("sana_video", mesh)}
    results["sana_video/unpacked"] = _outcome_of(lambda: _parity("sana_video", mesh, _unpacked_mix_ffn_plan()))
    with mock.patch("dtp.styles.conv.gather_channels", _reversed_gather):
        results["sana_video/reversed_gather"] = _parity("sana_video", mesh)
    clear_caches()  # the control must not be answered by the memo of the accepted plan
    with mock.patch("dtp.resolve.binding.heads._head_wide_out_dim", lambda module: ()):
        results["omnigen/out_dim_global"] = _outcome("omnigen", mesh)
    clear_caches()
    return results
