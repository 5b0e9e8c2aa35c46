"""The cfg axis without processes: batch rows, argument splitting and joining, call comparison, the mesh,
the refusal of unknown stateful hooks, and the wrapper's decisions (with the two collectives stubbed)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dtp
import dtp.runtime.cfg.wrapper as wrapper
from dtp.runtime.cfg import CFG_ATTR, install_cfg, remove_cfg
from dtp.runtime.cfg.batch import join_parts, rows, split_arguments
from dtp.runtime.cfg.host import HostGroups
from dtp.runtime.cfg.tree import differences, hold, matches, release, same
from dtp.runtime.mesh import cfg_degree, cfg_submesh, cp_degree, tp_submesh
from dtp.testing.tiny import tiny_model


@given(batch=st.integers(1, 40), parts=st.integers(1, 8))
def test_rows_are_tensor_split(batch, parts):
    """Group g's rows are torch.tensor_split's g-th piece: in order, covering the batch, sizes within 1."""
    expected = torch.tensor_split(torch.arange(batch), parts)
    for g in range(parts):
        start, stop = rows(batch, parts, g)
        assert torch.equal(torch.arange(batch)[start:stop], expected[g])


def test_split_cuts_every_batched_input_and_nothing_else():
    """Batch 3, rows [2, 3): dim-0 tensors (nested too) and per-sample lists cut; ids, scalars, others kept."""
    args = dict(
        hidden_states=torch.arange(3 * 4).view(3, 4),
        timestep=torch.tensor([1.0, 2.0, 3.0]),
        scale=torch.tensor(2.0),
        img_ids=torch.zeros(3, 3),  # per token, 3 tokens = the batch by chance
        added_cond_kwargs={"resolution": torch.ones(3, 2), "aspect_ratio": None},
        img_shapes=[[(1, 2, 2)], [(1, 2, 2)], [(1, 4, 4)]],
        other=torch.zeros(5, 3),
        return_dict=False,
    )
    out = split_arguments(args, 3, 2, 3)
    assert torch.equal(out["hidden_states"], args["hidden_states"][2:])
    assert torch.equal(out["timestep"], torch.tensor([3.0]))
    assert out["added_cond_kwargs"]["resolution"].shape == (1, 2) and out["added_cond_kwargs"]["aspect_ratio"] is None
    assert out["img_shapes"] == [[(1, 4, 4)]]
    assert out["img_ids"] is args["img_ids"] and out["scale"] is args["scale"] and out["other"] is args["other"]
    assert out["return_dict"] is False


def test_join_rebuilds_outputs_in_group_order():
    """Tensors concatenated, per-sample lists joined, diffusers' output class rebuilt as itself."""
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    a, b = torch.zeros(2, 3), torch.ones(1, 3)
    assert torch.equal(join_parts([(a,), (b,)], [2, 1])[0], torch.cat([a, b]))
    joined = join_parts([Transformer2DModelOutput(sample=a), Transformer2DModelOutput(sample=b)], [2, 1])
    assert isinstance(joined, Transformer2DModelOutput) and torch.equal(joined.sample, torch.cat([a, b]))
    first, second, third = a[0], a[1], b[0]
    assert join_parts([[first, second], [third]], [2, 1]) == [first, second, third]


def test_same_is_exact_and_held_tensors_see_in_place_changes():
    x = torch.randn(4)
    assert same({"a": [x, 1]}, {"a": [x.clone(), 1]})
    assert not same(x, x.double()) and not same(x, x + 1e-7) and not same([x], (x,)) and not same(None, x)
    held = hold({"h": x})
    assert release(held)["h"] is x  # no copy
    assert matches({"h": x}, held, values=False)  # identity: no read
    assert not matches({"h": x.clone()}, held, values=False) and matches({"h": x.clone()}, held, values=True)
    base = torch.randn(2, 6)
    half = hold(base.narrow(1, 3, 3))
    assert matches(base.narrow(1, 3, 3), half, values=False)  # another view of the same memory (CP's cut)
    assert not matches(base.narrow(1, 0, 3), half, values=False) and not matches(base[:, 3:].T, half, values=False)
    base.mul_(2)
    assert not matches(base.narrow(1, 3, 3), half, values=True)  # the base changed in place: the version moved
    x.add_(1)
    assert not matches({"h": x}, held, values=True)  # the version moved: the held values are gone
    before = hold({"h": x, "e": 1, "m": None, "t": torch.ones(2)})
    assert differences(before, {"h": x, "e": 2, "m": torch.ones(1), "t": torch.ones(2)}).keys() == {"e", "m"}


def test_identity_decisions_read_no_tensor():
    """Matching a call with its held self, or with other objects when values are not allowed, reads nothing."""
    from dtp.testing.syncs import StepSyncs

    call = {"h": torch.randn(2, 3), "t": torch.ones(2), "shapes": [(1, 2, 2)], "kw": {"a": torch.zeros(1)}}
    held = hold(call)
    with StepSyncs(first=0) as syncs:
        syncs.on = True
        assert matches(call, held, values=True)
        assert not matches({**call, "t": torch.ones(2)}, held, values=False)
    assert sum(syncs.counts.values()) == 0
    with StepSyncs(first=0) as syncs:
        syncs.on = True
        assert matches({**call, "t": torch.ones(2)}, held, values=True)
    assert syncs.counts["equal"] == 1  # the negative control: a value comparison is seen


def test_mesh_axes(fake_world):
    """cfg=2, tp=2 on 4 ranks: ("cfg", "cp", "tp"); the inner axes per cfg group; cfg=1 keeps ("cp", "tp")."""
    mesh = dtp.make_mesh(tp=2, cfg=2, device_type="cpu")
    assert mesh.mesh_dim_names == ("cfg", "cp", "tp") and mesh.shape == (2, 1, 2)
    assert (cfg_degree(mesh), cp_degree(mesh), tp_submesh(mesh).size(), cfg_submesh(mesh).size()) == (2, 1, 2, 2)
    plain = dtp.make_mesh(tp=2, cp=2, device_type="cpu")
    assert plain.mesh_dim_names == ("cp", "tp") and cfg_degree(plain) == 1
    with pytest.raises(dtp.PlanError, match=r"cfg \* cp \* tp = 2 \* 1 \* 1 = 2"):
        dtp.make_mesh(cfg=2, device_type="cpu")
    with pytest.raises(dtp.PlanError, match="no 'cfg' axis"):
        cfg_submesh(plain)


def test_parallelize_installs_the_wrapper_and_stateful_hooks_are_refused(fake_world):
    """`dtp.parallelize` on a cfg mesh wraps the forward; a model with a stateful hook that no cache config accounts
    for is refused untouched (diffusers' caches are checked per config by dtp.cache: tests/unit/test_cache.py)."""
    from diffusers.hooks.hooks import HookRegistry, ModelHook

    class Stateful(ModelHook):
        _is_stateful = True

    mesh = dtp.make_mesh(tp=2, cfg=2, device_type="cpu")
    model = dtp.parallelize(tiny_model("FluxTransformer2DModel"), mesh)
    assert getattr(model, CFG_ATTR).forward.__func__ is type(model).forward
    remove_cfg(model)
    assert "forward" not in vars(model)

    cached = tiny_model("FluxTransformer2DModel")
    HookRegistry.check_if_exists_or_initialize(cached.transformer_blocks[0]).register_hook(Stateful(), "mine")
    before = {k: v.clone() for k, v in cached.state_dict().items()}
    with pytest.raises(dtp.PlanError, match="stateful diffusers hooks.*transformer_blocks.0: mine"):
        dtp.parallelize(cached, mesh)
    assert "forward" not in vars(cached) or not hasattr(cached, CFG_ATTR)
    assert all(torch.equal(v, before[k]) for k, v in cached.state_dict().items())


# ---- the wrapper's decisions, one process standing for cfg group 1 ------------------------------


class _OneGroupOfTwo:
    """A stand-in cfg mesh: 2 groups, this process is group `rank`; the collectives are stubbed below."""

    def __init__(self, rank: int):
        self.rank = rank

    def __getitem__(self, axis):
        return self

    def size(self):
        return 2

    def get_local_rank(self):
        return self.rank

    def get_group(self):
        return None


class _Recorder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, hidden_states, encoder_hidden_states, timestep=None):
        self.calls.append((hidden_states.clone(), encoder_hidden_states.clone()))
        return (hidden_states * encoder_hidden_states.sum(),)


@pytest.fixture
def group1(monkeypatch):
    """A recording model wrapped as cfg group 1, with the exchange returning this group's output twice."""
    monkeypatch.setattr(wrapper, "agree_min", lambda flags, *groups: flags)
    monkeypatch.setattr(wrapper, "gather_parts", lambda output, *groups: [output, output])
    model = _Recorder()
    monkeypatch.setattr(wrapper, "check_cfg", lambda model, mesh: None)
    monkeypatch.setattr(wrapper, "host_groups", lambda mesh: HostGroups(span=(), cfg=None))
    install_cfg(model, _OneGroupOfTwo(rank=1))
    return model


def _loop(model, steps, prompts=("c", "u"), latents=None):
    """A denoising loop: per step one call per prompt, same latents within a step (as the pipelines)."""
    embeddings = {p: torch.full((1, 2), float(ord(p))) for p in "cuvw"}
    for step in range(steps):
        h = torch.full((1, 3), float(step if latents is None else latents))
        for p in prompts:
            model(h, embeddings[p], timestep=torch.tensor([step]))


def _ran(model) -> list[tuple[int, str]]:
    return [(int(h[0, 0]), chr(int(e[0, 0]))) for h, e in model.calls]


def test_pair_learned_at_step_0_then_group_1_runs_the_second_call(group1):
    _loop(group1, 3)
    assert vars(getattr(group1, CFG_ATTR).stats) == dict(batch=0, predicted=2, hits=2, whole=2)
    assert _ran(group1) == [(0, "c"), (0, "u"), (1, "u"), (2, "u")]  # steps 1, 2: only the predicted uncond


def test_one_call_per_step_predicts_nothing(group1):
    """Latents change every call: no pair, so no wasted prediction."""
    _loop(group1, 4, prompts=("c",))
    assert vars(getattr(group1, CFG_ATTR).stats) == dict(batch=0, predicted=0, hits=0, whole=4)


def test_new_prompts_cost_one_step_and_a_stopped_second_call_drops_the_prediction(group1):
    _loop(group1, 2)  # learns c/u
    _loop(group1, 2, prompts=("v", "w"))  # step 0: predicts u (wrong), runs w itself, relearns; step 1: hit
    assert _ran(group1)[-3:] == [(0, "u"), (0, "w"), (1, "w")]
    _loop(group1, 3, prompts=("v",), latents=None)  # the second call stops (cfg truncation)
    stats = getattr(group1, CFG_ATTR).stats
    assert (stats.predicted, stats.hits) == (4, 2)  # one wasted prediction each time, then none


def test_a_batch_splits_by_rows(group1):
    group1(torch.arange(3.0).view(3, 1), torch.ones(3, 2), timestep=torch.zeros(3))
    ((h, e),) = group1.calls
    assert h.tolist() == [[2.0]] and e.shape == (1, 2)  # group 1 of 2: row 2 of 3
