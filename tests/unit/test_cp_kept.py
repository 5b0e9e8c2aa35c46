"""`cp.keep` (runtime/cp/kept.py): the rows each rank keeps of a sequence's last n, and the plan section's parsing."""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dtp
from dtp.plan.cp import KeepRule
from dtp.runtime.cp.hooks import PadState
from dtp.runtime.cp.kept import KeepState, KeepTokens, kept_range


@given(st.integers(1, 8), st.integers(1, 200), st.data())
def test_kept_ranges_concatenate_to_the_last_rows(cp, total, data):
    """Rank r's kept rows, taken from its chunk of the sequence padded to a multiple of cp and concatenated in rank
    order, are exactly the last n real rows (what one process's `x[:, -n:]` keeps), never a pad row."""
    kept = data.draw(st.integers(1, total))
    rows = -(-total // cp)
    sequence = list(range(total)) + [None] * (rows * cp - total)
    chunks = [sequence[r * rows : (r + 1) * rows] for r in range(cp)]
    out = []
    for r, chunk in enumerate(chunks):
        begin, end = kept_range(r, rows, total, kept)
        assert 0 <= begin <= end <= rows
        out += chunk[begin:end]
    assert out == list(range(total - kept, total))


def test_kept_range_example():
    assert kept_range(0, 17, 34, 16) == (17, 17) and kept_range(1, 17, 34, 16) == (1, 17)
    assert kept_range(1, 17, 33, 16) == (0, 16)


def _plan(keep: dict) -> dict:
    split = {"blocks.0": {"hidden_states": {"dim": 1}}}
    return {"tp": {"proj_out": "colwise"}, "cp": {"split": split, "gather": {"proj_out": {"dim": 1}}, "keep": keep}}


def test_keep_section_parses():
    plan = dtp.Plan.from_dict(_plan({"blocks.-1": {0: {"of": "blocks.0.hidden_states", "last": "embed"}}}))
    (rule,) = plan.cp.keep
    assert (rule.key, rule.name, rule.of, rule.last) == ("blocks.-1", 0, "blocks.0.hidden_states", "embed")
    assert rule.after is None and rule.gather is None


@pytest.mark.parametrize(
    "spec",
    [
        {"last": "embed"},  # no `of`
        {"of": "blocks.0.hidden_states", "last": "embed", "after": "blocks.0.text"},  # both
        {"of": "blocks.0.hidden_states", "after": "blocks.0.text", "gather": "proj_out"},  # gather needs `last`
        {"of": "blocks.0.hidden_states", "last": "embed", "trim": "last"},  # unknown field
    ],
)
def test_bad_keep_rules_are_plan_errors(spec):
    with pytest.raises(dtp.PlanError, match="cp.keep"):
        dtp.Plan.from_dict(_plan({"norm": {"x": spec}}))


class _Norm(torch.nn.Module):
    def forward(self, hidden_states, scale=None):
        return hidden_states


def test_keep_pre_hook_replaces_the_input_without_signature_bind(monkeypatch):
    """ConsisID's `after` keep as a pre-hook: [T zero rows, the `of` chunk] replaces the input where it was passed
    (positionally or by keyword), found by its position once (`Binder`): `Signature.bind` per call, which dynamo cannot
    trace (a graph break under torch.compile(fullgraph=True)), is never called."""
    pads = PadState()
    pads.lengths.update({"b.text": (2, 3), "b.video": (4, 8)})  # rank's 2 of 3 text rows, 4 of 8 video rows
    rule = KeepRule("norm", "hidden_states", "b.video", after="b.text")
    hook = KeepTokens("norm", _Norm(), rule, 1, 2, pads, KeepState())
    monkeypatch.setattr(inspect.Signature, "bind", lambda *a, **k: pytest.fail("Signature.bind called"))
    x = torch.arange(6.0).view(1, 6, 1)  # [text_r (2) | video_r (4)]
    expected = torch.cat([torch.zeros(1, 3, 1), x[:, 2:]], dim=1)
    args, kwargs = hook(None, (x,), {"scale": 2})
    assert torch.equal(args[0], expected) and kwargs == {"scale": 2}
    args, kwargs = hook(None, (), {"hidden_states": x})
    assert args == () and torch.equal(kwargs["hidden_states"], expected)
