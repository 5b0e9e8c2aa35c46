"""The cfg step path without processes: which group runs which pass, what a step's later calls are learned from,
how they are predicted and verified (reads counted), the refusal of a degree that does not divide a known
pipeline's passes, and the step's cost."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dtp.errors import ForwardError, PlanError
from dtp.runtime.cfg.passes import TRUSTED_ROWS, check_passes, guidance_passes
from dtp.runtime.cfg.steps import (
    FIRST,
    HELD,
    ROWS,
    Call,
    Cycle,
    Steps,
    assignment,
    leaf_tree,
    learn_sources,
    signature,
    verify,
)
from dtp.runtime.cfg.tree import hold
from dtp.testing.syncs import StepSyncs


@given(batches=st.lists(st.integers(1, 4), min_size=1, max_size=5), groups=st.integers(1, 8))
def test_every_pass_runs_once_in_order(batches, groups):
    """Each group takes P / K consecutive passes; together the groups cover every row of every call once, in order."""
    passes = [(i, r) for i, b in enumerate(batches) for r in range(b)]
    if len(passes) % groups:
        groups = 1
    taken = []
    for g in range(groups):
        mine = [(i, r) for i, start, stop in assignment(batches, groups, g) for r in range(start, stop)]
        assert len(mine) == len(passes) // groups
        taken += mine
    assert taken == passes


def test_ltx2_passes_over_two_and_four_groups():
    """LTX-2's step (the doubled batch, STG, modality): cfg=2 keeps the doubled batch whole on group 0."""
    assert [assignment([2, 1, 1], 2, g) for g in range(2)] == [[(0, 0, 2)], [(1, 0, 1), (2, 0, 1)]]
    assert [assignment([2, 1, 1], 4, g) for g in range(4)] == [[(0, 0, 1)], [(0, 1, 2)], [(1, 0, 1)], [(2, 0, 1)]]


def _ltx2_step(timesteps: torch.Tensor, i: int, latents: torch.Tensor, embeds: torch.Tensor, blocks: list) -> list:
    """The arguments of LTX-2's three calls of step i, made as diffusers 0.42.1 makes them (views included)."""
    timestep = timesteps[i].expand(2)
    first = dict(hidden_states=torch.cat([latents] * 2), encoder_hidden_states=embeds, timestep=timestep)
    first.update(sigma=timestep, stg=None, isolate=False, context="cond_uncond")
    later = dict(hidden_states=latents, encoder_hidden_states=embeds.chunk(2)[1], timestep=timestep.chunk(2)[0])
    later.update(sigma=later["timestep"], stg=None, isolate=False)
    return [first, {**later, "stg": blocks, "context": "uncond_stg"}, {**later, "isolate": True, "context": "mod"}]


def _call(arguments: dict) -> Call:
    batch = arguments["hidden_states"].shape[0]
    return Call(hold(arguments), signature(arguments), batch, leaf_tree(torch.zeros(batch, 3)))


def test_sources_prediction_and_verification_of_ltx2_calls():
    """Learned from step 0: the latents and embeddings are rows of the doubled batch, the STG blocks and context
    held; step 1's later calls are predicted from its first call, and verified with one read (the latents, a new
    object each step), shared by the two later calls; views of the same memory need none."""
    timesteps, embeds, blocks = torch.tensor([1000.0, 500.0]), torch.randn(2, 4, 3), [1]
    step0 = _ltx2_step(timesteps, 0, torch.randn(1, 5, 3), embeds, blocks)
    sources = learn_sources([_call(a) for a in step0])
    stg = sources[1]
    assert {name: s.kind for name, s in stg.items()} == dict(
        hidden_states=ROWS, encoder_hidden_states=ROWS, timestep=ROWS, sigma=ROWS, stg=HELD, isolate=FIRST, context=HELD
    )
    assert (stg["encoder_hidden_states"].start, stg["timestep"].start) == (1, 0)  # views: the rows they are
    cycle = Cycle([_call(a) for a in step0], sources)
    step1 = _ltx2_step(timesteps, 1, torch.randn(1, 5, 3), embeds, blocks)
    predicted = cycle.predict(step1[0])
    checked = {}
    with StepSyncs(first=0) as syncs:
        syncs.on = True
        assert verify(step1[1], hold(predicted[1]), checked)
        assert verify(step1[2], hold(predicted[2]), checked)
    assert syncs.counts["_local_scalar_dense"] == 1 and syncs.counts["equal"] == 0, dict(syncs.counts)
    wrong = dict(step1[1], hidden_states=step1[1]["hidden_states"] + 1)
    assert not verify(wrong, hold(predicted[1]), {})
    assert not verify(dict(step1[1], stg=[2]), hold(predicted[1]), {})


def test_trusted_rows_are_compared_on_the_device_and_read_once():
    """LTX-2's latents (TRUSTED_ROWS): no read per call; a difference surfaces at `check_deferred` (one read)."""
    timesteps, embeds, blocks = torch.tensor([1000.0, 500.0]), torch.randn(2, 4, 3), [1]
    step0 = _ltx2_step(timesteps, 0, torch.randn(1, 5, 3), embeds, blocks)
    cycle = Cycle([_call(a) for a in step0], learn_sources([_call(a) for a in step0]))
    step1 = _ltx2_step(timesteps, 1, torch.randn(1, 5, 3), embeds, blocks)
    steps, predicted, deferred = Steps(2, 0), cycle.predict(step1[0]), []
    with StepSyncs(first=0) as syncs:
        syncs.on = True
        for i in (1, 2):
            assert verify(step1[i], hold(predicted[i]), steps.checked, TRUSTED_ROWS, deferred)
        steps.defer(deferred, TRUSTED_ROWS)
    assert sum(syncs.counts.values()) == 0, dict(syncs.counts)
    assert len(deferred) == 1  # the latents, once for both calls
    steps.check_deferred()
    wrong = dict(step1[1], hidden_states=step1[1]["hidden_states"] + 1)
    deferred = []
    assert verify(wrong, hold(predicted[1]), {}, TRUSTED_ROWS, deferred)  # accepted now ...
    steps.defer(deferred, TRUSTED_ROWS)
    with pytest.raises(ForwardError, match="other values of audio_hidden_states, hidden_states"):  # ... refused later
        steps.check_deferred()


def test_true_cfg_pipelines_trust_their_timestep():
    """The pair path trusts `timestep` for diffusers' true-CFG pipelines that pass `timestep / 1000` to both calls
    (Qwen-Image, FLUX.1, Chroma), not for Wan (one timestep object: nothing to trust) nor for a pipeline that
    overrides `__call__` (its source was not read), nor without a pipeline."""
    from diffusers import ChromaPipeline, FluxPipeline, QwenImagePipeline, WanPipeline

    from dtp.runtime.cfg.passes import TRUSTED_PAIR, trusted_pair

    class Mine(FluxPipeline):
        def __call__(self, *args, **kwargs):
            return super().__call__(*args, **kwargs)

    for cls, expected in (
        (QwenImagePipeline, TRUSTED_PAIR),
        (FluxPipeline, TRUSTED_PAIR),
        (ChromaPipeline, TRUSTED_PAIR),
    ):
        assert trusted_pair(cls.__new__(cls)) == expected, cls
    for cls in (WanPipeline, Mine):
        assert trusted_pair(cls.__new__(cls)) == frozenset(), cls
    assert trusted_pair(None) == frozenset()


def test_a_step_qualifies_when_it_is_not_the_pair_or_batch_paths_and_k_divides_it():
    """Two calls of one batch stay on the pair / batch paths; 4 passes over 3 groups stay per call."""
    calls = [_call(dict(hidden_states=torch.zeros(b, 2))) for b in (2, 1, 1)]
    assert Steps(2, 0).qualifies(calls) and Steps(4, 0).qualifies(calls)
    assert not Steps(3, 0).qualifies(calls)
    assert not Steps(2, 0).qualifies(calls[1:])  # a pair
    assert Steps(3, 0).qualifies(calls[:2])  # a doubled batch and one call: 3 passes


def test_the_step_is_learned_at_the_first_calls_signature():
    """The record runs from one first call to the next call with its signature."""
    steps = Steps(2, 0)
    step = [dict(hidden_states=torch.zeros(b, 2), context=c) for b, c in ((2, "a"), (1, "b"), (1, "c"))]
    for arguments in step:
        steps.boundary(signature(arguments))
        steps.observe(arguments, signature(arguments), torch.zeros(arguments["hidden_states"].shape[0], 3))
    assert steps.cycle is None and len(steps.record) == 3
    steps.boundary(signature(step[0]))
    assert steps.cycle is not None and steps.cycle.batches == [2, 1, 1] and steps.record == []


class _Guided:
    """A stand-in for an LTX-2 pipeline mid-call: its three guidance properties."""

    def __init__(self, cfg: bool, stg: bool, modality: bool):
        self._flags = cfg, stg, modality

    do_classifier_free_guidance = property(lambda self: self._flags[0])
    do_spatio_temporal_guidance = property(lambda self: self._flags[1])
    do_modality_isolation_guidance = property(lambda self: self._flags[2])


def test_known_passes_and_the_refusal():
    """4, 3 and 2 passes from the guidance; cfg=2 refuses 3 (naming the divisors); unknown pipelines pass."""
    assert guidance_passes(_Guided(True, True, True)) == 4
    assert guidance_passes(_Guided(True, False, True)) == 3
    assert guidance_passes(_Guided(False, False, False)) == 1
    assert guidance_passes(object()) is None
    check_passes(_Guided(True, True, True), 4)
    check_passes(object(), 3)
    with pytest.raises(PlanError, match=r"cfg=2 does not divide the 3 transformer passes.*\[1, 3\]"):
        check_passes(_Guided(True, False, True), 2)


def test_cost_of_a_step_on_the_step_path():
    """LTX-2 at cfg=2 on 2 ranks: one all_gather of the 4 passes' outputs, the 2 later calls' flags; no header."""
    from dtp.runtime.cfg.cost import step_passes_exchange

    assert step_passes_exchange(100, 4, 3, 2, 2) == [("all_gather", 400, 2), ("all_reduce", 8, 2), ("all_reduce", 8, 2)]
    with pytest.raises(AssertionError):
        step_passes_exchange(100, 3, 2, 2, 2)
