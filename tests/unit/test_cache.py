"""dtp.cache without processes: the rank-consistent FirstBlockCache decision against diffusers' own, the refusals
(per config and axis, before anything changes), the CLI names, and the cfg wrapper with cache hooks (group 1 runs
the predicted call under the second call's cache context; shared state runs whole; hooks behind dtp refused)."""

from __future__ import annotations

import pytest
import torch
from diffusers.hooks import (
    FasterCacheConfig,
    FirstBlockCacheConfig,
    PyramidAttentionBroadcastConfig,
    SeaCacheConfig,
    TaylorSeerCacheConfig,
    TextKVCacheConfig,
)
from diffusers.hooks.first_block_cache import FBCHeadBlockHook, FBCSharedBlockState
from diffusers.hooks.hooks import HookRegistry, ModelHook, StateManager
from diffusers.models.cache_utils import CacheMixin
from hypothesis import assume, given
from hypothesis import strategies as st

import dtp
import dtp.runtime.cfg.wrapper as wrapper
from dtp.cache import CACHE_NAMES, DecisionScope, make_config
from dtp.cache.consistent import fbc_should_compute
from dtp.runtime.cfg import BRANCH_ATTR, CFG_ATTR, PER_CONTEXT, SHARED, install_cfg
from dtp.runtime.cfg.host import HostGroups
from dtp.testing.tiny import tiny_model


class _OneRankMesh:
    """A mesh without axes: DecisionScope reduces over nothing (one process)."""

    mesh_dim_names = ()


def _fbc_hook(threshold: float, previous: torch.Tensor | None) -> FBCHeadBlockHook:
    manager = StateManager(FBCSharedBlockState)
    manager.set_context(dtp_context("cond"))
    manager.get_state().head_block_residual = previous
    return FBCHeadBlockHook(manager, threshold)


def dtp_context(name: str):
    from diffusers.hooks.hooks import CacheContext

    return CacheContext(name)


@given(
    seed=st.integers(0, 2**16),
    threshold=st.floats(0.01, 2.0),
    shape=st.tuples(st.integers(1, 2), st.integers(1, 9), st.integers(1, 8)),
)
def test_fbc_decision_is_diffusers_own_on_one_rank(seed, threshold, shape):
    """With nothing to reduce over, dtp's FirstBlockCache decision is diffusers' (away from the threshold's edge)."""
    g = torch.Generator().manual_seed(seed)
    previous, residual = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    ratio = ((residual - previous).abs().mean() / previous.abs().mean()).item()
    assume(abs(ratio - threshold) > 1e-5 * threshold)
    hook = _fbc_hook(threshold, previous)
    ours = fbc_should_compute(hook, DecisionScope(_OneRankMesh(), None), residual)
    assert ours == hook._should_compute_remaining_blocks(residual) == (ratio > threshold)


def test_fbc_first_call_computes():
    hook = _fbc_hook(0.5, None)
    assert fbc_should_compute(hook, DecisionScope(_OneRankMesh(), None), torch.ones(1, 2, 3)) is True


# ---- refusals: per config and axis, before anything changes (fake world, meshes of up to 4 ranks) -----------------

REFUSED = [
    (dict(cfg=2, tp=2), FasterCacheConfig(current_timestep_callback=lambda: 500), "cfg=2: it splits the doubled"),
    (dict(cp=2, tp=2), SeaCacheConfig(), "tp=2: diffusers runs it fail-open on blocks with DTensor parameters"),
    (dict(cp=4), TextKVCacheConfig(), "cp=4: it only hooks NucleusMoE-Image's blocks"),
]


@pytest.mark.parametrize("dims, config, why", REFUSED, ids=lambda v: str(v)[:30])
def test_enable_cache_after_sharding_is_refused_untouched(fake_world, dims, config, why):
    """enable_cache on the sharded model: a PlanError naming the config, the axis and why; no hook added."""
    model = dtp.parallelize(tiny_model("FluxTransformer2DModel"), dtp.make_mesh(device_type="cpu", **dims))
    with pytest.raises(dtp.PlanError, match=f"{type(config).__name__}.*{why}"):
        model.enable_cache(config)
    assert model._cache_config is None
    assert not any(getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in model.modules())


@pytest.mark.parametrize("dims, config, why", REFUSED[:3], ids=lambda v: str(v)[:30])
def test_cache_enabled_before_sharding_is_refused_untouched(fake_world, dims, config, why):
    """A cache enabled before dtp.parallelize: refused by prepare, the model exactly as it was."""
    model = tiny_model("FluxTransformer2DModel")
    model.enable_cache(config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(dtp.PlanError, match=why):
        dtp.parallelize(model, dtp.make_mesh(device_type="cpu", **dims))
    assert not hasattr(model, CFG_ATTR) and "enable_cache" not in vars(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_cache_enabled_before_sharding_is_made_consistent(fake_world):
    """FirstBlockCache enabled before dtp.parallelize on cfg=2 x tp=2: re-enabled through dtp, every hook marked,
    the head hook's decision replaced on the instance (diffusers' class untouched)."""
    model = tiny_model("FluxTransformer2DModel")
    model.enable_cache(FirstBlockCacheConfig(threshold=0.1))
    dtp.parallelize(model, dtp.make_mesh(tp=2, cfg=2, device_type="cpu"))
    hooks = [h for m in model.modules() for h in getattr(getattr(m, "_diffusers_hook", None), "hooks", {}).values()]
    assert hooks and all(getattr(h, BRANCH_ATTR) == PER_CONTEXT for h in hooks)
    (head,) = [h for h in hooks if isinstance(h, FBCHeadBlockHook)]
    assert "_should_compute_remaining_blocks" in vars(head)
    assert "_should_compute_remaining_blocks" in vars(FBCHeadBlockHook)


@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
def test_seacache_with_fsdp_is_refused_untouched(fake_world, before):
    """fsdp=True: diffusers' SeaCache would run fail-open on FSDP-managed blocks (never skipping): a PlanError,
    naming fsdp and its fix, from enable_cache (no hook added) or from prepare (the model unsharded)."""
    model = tiny_model("FluxTransformer2DModel")
    mesh = dtp.make_mesh(cp=4, device_type="cpu")
    if before:
        model.enable_cache(SeaCacheConfig())
        with pytest.raises(dtp.PlanError, match="SeaCacheConfig .sea. on fsdp=4: .* FSDP-managed .* fsdp=False"):
            dtp.parallelize(model, mesh, fsdp=True)
        assert not any(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())
        return
    dtp.parallelize(model, mesh, fsdp=True)
    with pytest.raises(dtp.PlanError, match="SeaCacheConfig .sea. on fsdp=4: .* FSDP-managed .* fsdp=False"):
        model.enable_cache(SeaCacheConfig())
    assert not any(getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in model.modules())


@pytest.mark.parametrize(
    "name, before",
    [("FluxTransformer2DModel", False), pytest.param("QwenImageTransformer2DModel", True, marks=pytest.mark.full)],
)
def test_seacache_without_an_adapter_is_refused_untouched(fake_world, name, before):
    """SeaCache on FLUX.1 / Qwen-Image (no raw-vision adapter in diffusers, no callback given): diffusers would run it
    fail-open, never skipping, so dtp refuses it on cp=4, naming the model and the fix; Wan T2V (an adapter) and a
    given callback are accepted."""
    why = f"SeaCacheConfig .sea. on {name}: .* never skip. Pass SeaCacheConfig.raw_vision_callback"
    mesh = dtp.make_mesh(cp=4, device_type="cpu")
    model = tiny_model(name)
    if before:
        model.enable_cache(SeaCacheConfig())
        with pytest.raises(dtp.PlanError, match=why):
            dtp.parallelize(model, mesh)
        assert not any(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())
    else:
        dtp.parallelize(model, mesh)
        with pytest.raises(dtp.PlanError, match=why):
            model.enable_cache(SeaCacheConfig())
        assert not any(getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in model.modules())
        model.enable_cache(SeaCacheConfig(raw_vision_callback=lambda module, args, kwargs: None))
        assert isinstance(model._cache_config, SeaCacheConfig)
    wan = dtp.parallelize(tiny_model("WanTransformer3DModel"), mesh)
    wan.enable_cache(SeaCacheConfig())
    assert isinstance(wan._cache_config, SeaCacheConfig)


def test_body_probe_calls_the_forward_it_wraps_even_when_that_has_a_forward_field():
    """A probe under a root-level hook wraps the cfg wrapper, a dataclass whose own `forward` field is the model's
    forward: functools.update_wrapper copies that field onto the probe, which then bypassed the wrapper."""
    from dtp.runtime.probe import BodyProbe, body_runs

    class Wrapper:
        def __init__(self):
            self.forward = lambda: "model"  # what update_wrapper copies

        def __call__(self):
            return "wrapper"

    module = torch.nn.Linear(1, 1)
    probe = BodyProbe(module, Wrapper())
    assert probe() == "wrapper" and body_runs(module) == 1


def test_pab_state_is_shared_between_branches(fake_world):
    model = dtp.parallelize(tiny_model("FluxTransformer2DModel"), dtp.make_mesh(cfg=2, tp=2, device_type="cpu"))
    model.enable_cache(PyramidAttentionBroadcastConfig(current_timestep_callback=lambda: 500))
    hooks = [h for m in model.modules() for h in getattr(getattr(m, "_diffusers_hook", None), "hooks", {}).values()]
    assert hooks and {getattr(h, BRANCH_ATTR) for h in hooks} == {SHARED}


# ---- the CLI's names --------------------------------------------------------------------------------------------


class _Pipe:
    current_timestep = 500


def test_every_name_makes_its_config():
    made = {name: type(make_config(_Pipe(), name, steps=8)).__name__ for name in CACHE_NAMES}
    assert made == {
        "fbc": "FirstBlockCacheConfig",
        "taylorseer": "TaylorSeerCacheConfig",
        "pab": "PyramidAttentionBroadcastConfig",
        "faster": "FasterCacheConfig",
        "mag": "MagCacheConfig",
        "sea": "SeaCacheConfig",
    }
    assert make_config(_Pipe(), "fbc", 0.2).threshold == 0.2
    assert make_config(_Pipe(), "pab").current_timestep_callback() == 500
    assert isinstance(make_config(_Pipe(), "taylorseer"), TaylorSeerCacheConfig)


@pytest.mark.parametrize(
    "name, threshold, steps, match",
    [("teacache", None, 8, "not one of"), ("pab", 0.1, 8, "has no threshold"), ("mag", 0.1, None, "inference steps")],
)
def test_bad_names_and_options(name, threshold, steps, match):
    with pytest.raises(dtp.PlanError, match=match):
        make_config(_Pipe(), name, threshold, steps)


# ---- the cfg wrapper with cache hooks: one process standing for cfg group 1 ------------------------------------


class _Context(ModelHook):
    """A stateful hook with one state per cache context: records the context each real call runs under."""

    _is_stateful = True

    def __init__(self, seen: list):
        super().__init__()
        self.state_manager, self.seen = StateManager(dict), seen

    def pre_forward(self, module, *args, **kwargs):
        self.seen.append(self.state_manager.context.name)
        return args, kwargs


class _Cached(torch.nn.Module, CacheMixin):
    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, hidden_states, encoder_hidden_states):
        self.calls.append(int(hidden_states[0, 0]))
        return (hidden_states * encoder_hidden_states.sum(),)


class _OneGroupOfTwo:
    def __getitem__(self, axis):
        return self

    def size(self):
        return 2

    def get_local_rank(self):
        return 1

    def get_group(self):
        return None


def _group1(monkeypatch, branch_state: str | None):
    monkeypatch.setattr(wrapper, "agree_min", lambda flags, *groups: flags)
    monkeypatch.setattr(wrapper, "gather_parts", lambda output, *groups: [output, output])
    monkeypatch.setattr(wrapper, "check_cfg", lambda model, mesh: None)
    monkeypatch.setattr(wrapper, "host_groups", lambda mesh: HostGroups(span=(), cfg=None))
    model, seen = _Cached(), []
    hook = _Context(seen)
    if branch_state is not None:
        setattr(hook, BRANCH_ATTR, branch_state)
    HookRegistry.check_if_exists_or_initialize(model).register_hook(hook, "context")
    install_cfg(model, _OneGroupOfTwo())
    return model, seen


def _true_cfg(model, steps: int, names=("cond", "uncond")):
    prompts = {"cond": torch.ones(1, 2), "uncond": torch.full((1, 2), 2.0), "other": torch.full((1, 2), 3.0)}
    for step in range(steps):
        h = torch.full((1, 3), float(step))
        for name in names:
            with model.cache_context(name):
                model(h, prompts[name])


def test_group_1_runs_the_predicted_call_in_the_second_calls_context(monkeypatch):
    """Steps 1, 2: group 1 runs only the uncond call, and under "uncond" (its per-context state sees only uncond)."""
    model, seen = _group1(monkeypatch, PER_CONTEXT)
    _true_cfg(model, 3)
    assert model.calls == [0, 0, 1, 2] and seen == ["cond", "uncond", "uncond", "uncond"]
    assert vars(getattr(model, CFG_ATTR).stats) == dict(batch=0, predicted=2, hits=2, whole=2)


def test_shared_state_runs_every_call_on_every_group(monkeypatch):
    model, seen = _group1(monkeypatch, SHARED)
    _true_cfg(model, 3)
    assert model.calls == [0, 0, 1, 1, 2, 2] and seen == ["cond", "uncond"] * 3


def test_hooks_behind_dtp_are_refused_before_the_forward(monkeypatch):
    model, seen = _group1(monkeypatch, None)
    with pytest.raises(dtp.ForwardError, match="did not make rank-consistent.*context"):
        _true_cfg(model, 1)
    assert model.calls == [] and seen == []


def test_a_missed_prediction_with_a_cache_is_an_error(monkeypatch):
    """Group 1 already ran the predicted uncond call into its cache state; a different second call cannot be exact."""
    model, _ = _group1(monkeypatch, PER_CONTEXT)
    _true_cfg(model, 2)
    with pytest.raises(dtp.ForwardError, match="not the predicted second call"):
        _true_cfg(model, 1, names=("cond", "other"))
