"""A sync-free denoising step: host reads per steady-state step, dtp's sharded pipelines vs diffusers' own.

Tiny pipelines, 4 steps, 2 gloo processes; counted from step 2 to 4 (`dtp.testing.syncs.StepSyncs`: scalar reads,
torch.equal, .tolist(), tensors made from Python data, torch.cuda.synchronize). The reference is diffusers'
one-process pipeline under the same counter, in the pytest process. Runs: (cfg=2) on the pair path (Qwen-Image with
true_cfg_scale: two calls per step, each with its own `timestep / 1000`, compared on the device and read once per
generation by `check_predictions`, called after each generation as `dtp run` does; the counters prove the pairs were
answered by the exchange) and on the batch path (PixArt-Sigma: a doubled batch), (cp=2) and (tp=2) on Wan (no
attention mask: CP's mask checks belong to dtp/runtime/cp); Wan at cfg=2 (the pair path with one timestep object) is
`full`. Negative controls: the exchange's shape header read back from the mesh's device group with .tolist(), as
before, is seen; a second call whose timestep differs from the first's is answered (no read) and refused by
`check_predictions`.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from cfg_cases import CASES, PROMPT

from dtp.testing.launch import spawn
from dtp.testing.scope import full_run
from dtp.testing.syncs import StepSyncs

STEPS = 4
RUNS = [("qwenimage", dict(cfg=2)), ("pixart", dict(cfg=2)), ("wan", dict(cp=2)), ("wan", dict(tp=2))]
FULL_RUNS = [("wan", dict(cfg=2))]


def count(pipe, case: str, steps: int = STEPS) -> dict[str, float]:
    """Host reads per step of steps 2..`steps` of the case's generation."""
    _, call = CASES[case]
    pipe.set_progress_bar_config(disable=True)
    with StepSyncs(first=1, steps=steps) as syncs:
        if "callback_on_step_end" in inspect.signature(pipe.__call__).parameters:
            callback = dict(callback_on_step_end=syncs.end_step)
        else:  # PixArt-Sigma: the older per-step callback, at the same place (after the scheduler's step)
            callback = dict(callback=lambda step, t, latents: syncs.end_step(pipe, step, t, {}), callback_steps=1)
        pipe(
            prompt=PROMPT,
            num_inference_steps=steps,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="np",
            **callback,
            **call,
        )
    assert syncs.steps == steps - 1, (case, syncs.steps, dict(syncs.counts))
    return syncs.per_step()


def rank_job(rank: int, world: int, runs: list, control: bool) -> dict:
    import dtp
    from dtp.runtime.cfg import CFG_ATTR, check_predictions

    out = {}
    for case, dims in runs:
        pipe = CASES[case][0]()
        dtp.parallelize_pipeline(pipe, dtp.make_mesh(**dims))
        out[(case, str(dims))] = count(pipe, case)
        check_predictions(pipe.transformer)  # as `dtp run` does: the device-side comparisons, one read
        wrapper = getattr(pipe.transformer, CFG_ATTR, None)
        out[(case, str(dims), "stats")] = None if wrapper is None else vars(wrapper.stats).copy()
    if control:
        out["control"] = _control()
        out["timestep control"] = _timestep_control()
    out["separate"] = _separate_groups(rank)
    return out


def _separate_groups(rank: int) -> list:
    """The gloo side groups a GPU mesh gets, made here on the CPU mesh (`separate=True`), and what they exchange."""
    import torch.distributed as dist

    import dtp
    from dtp.runtime.cfg import host

    groups = host.host_groups(dtp.make_mesh(cfg=2), separate=True)
    lines = host.axis_groups(dtp.make_mesh(cp=2), separate=True)
    backends = [dist.get_backend(g) for g in (*groups.span, groups.cfg, *lines.values())]
    return [
        backends,
        sorted(lines),
        host.min_ints([rank, 5], groups.span),
        host.gather_ints([rank, 7], 3, groups.cfg),
        host.max_ints([rank], list(lines.values())),
    ]


def _control() -> dict[str, float]:
    """Wan at cfg=2 with the shape header exchanged the old way: on the mesh's device group, read with .tolist()."""
    import torch.distributed as dist

    import dtp
    import dtp.runtime.cfg.exchange as exchange

    def device_header(local, group, *device):
        header = [len(local)] + [v for t in local for v in (t.ndim, *t.shape)]
        mine = torch.full((exchange.MAX_HEADER,), -1, dtype=torch.int64, device=local[0].device)
        mine[: len(header)] = torch.tensor(header, dtype=torch.int64, device=local[0].device)
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, mine, group=group)
        return [exchange._parse_header(h.tolist(), len(local)) for h in gathered]

    real = exchange._gather_shapes
    exchange._gather_shapes = device_header
    try:
        pipe = CASES["wan"][0]()
        dtp.parallelize_pipeline(pipe, dtp.make_mesh(cfg=2))
        return count(pipe, "wan")
    finally:
        exchange._gather_shapes = real


def _timestep_control() -> tuple:
    """Qwen-Image at cfg=2, 3 steps, the second call of steps 1 and 2 given `timestep + 1`: (the host reads per step,
    the pair path's hits, the ForwardError's message from `check_predictions`, or None)."""
    import dtp
    from dtp.runtime.cfg import CFG_ATTR, check_predictions

    pipe = CASES["qwenimage"][0]()
    dtp.parallelize_pipeline(pipe, dtp.make_mesh(cfg=2))
    wrapper, calls = pipe.transformer.forward, []

    def shifted(*args, **kwargs):  # from step 1 on (step 0 learns the pair)
        calls.append(None)
        if len(calls) > 2 and len(calls) % 2 == 0:
            kwargs["timestep"] = kwargs["timestep"] + 1
        return wrapper(*args, **kwargs)

    pipe.transformer.forward = shifted
    counted = count(pipe, "qwenimage", steps=3)
    try:
        check_predictions(pipe.transformer)
    except dtp.ForwardError as error:
        return counted, getattr(pipe.transformer, CFG_ATTR).stats.hits, str(error)
    return counted, getattr(pipe.transformer, CFG_ATTR).stats.hits, None


def _all_runs() -> list:
    return RUNS + (FULL_RUNS if full_run() else [])


@pytest.fixture(scope="module")
def refs():
    return {case: count(CASES[case][0](), case) for case in dict.fromkeys(case for case, _ in _all_runs())}


@pytest.fixture(scope="module")
def results():
    return spawn(rank_job, 2, _all_runs(), True)


@pytest.mark.parametrize(("case", "dims"), RUNS, ids=[f"{c}-{d}" for c, d in RUNS])
def test_no_more_host_reads_than_diffusers(results, refs, case, dims):
    """Every kind of host read, per steady-state step, on every rank: at most diffusers' one-process count."""
    for rank in results:
        counted = rank[(case, str(dims))]
        print(case, dims, counted, "diffusers", refs[case])
        assert all(counted[kind] <= refs[case][kind] for kind in counted), (case, dims, counted, refs[case])


def test_the_pair_path_was_taken(results):
    """Qwen-Image at cfg=2: every steady-state pair answered by the exchange (a miss would run whole and read
    nothing)."""
    expected = dict(batch=0, predicted=STEPS - 1, hits=STEPS - 1, whole=2)
    assert results[0][("qwenimage", str(dict(cfg=2)), "stats")] == expected
    assert results[0][("pixart", str(dict(cfg=2)), "stats")] == dict(batch=STEPS, predicted=0, hits=0, whole=0)


def test_a_different_timestep_is_refused_after_the_generation(results, refs):
    """Negative control: a second call whose timestep is not the first's is answered by the exchange without a read
    (the pipeline is trusted), then refused by `check_predictions` (one read per generation), naming the timestep."""
    for rank in results:
        counted, hits, error = rank["timestep control"]
        assert all(counted[kind] <= refs["qwenimage"][kind] for kind in counted), counted
        assert hits == 2 and error is not None and "other values of timestep" in error, (hits, error)


def test_side_groups_for_a_device_mesh(results):
    """`separate=True` (a GPU mesh's path): new gloo groups over the world, each cfg line and each axis line."""
    for rank, result in enumerate(results):
        assert result["separate"] == [["gloo"] * 3, ["cp"], [0, 5], [[0, 7, -1], [1, 7, -1]], [1]], rank


def test_a_device_header_is_seen(results, refs):
    """Negative control: the shape header read back from the device group makes tolist reads diffusers has not."""
    assert results[0]["control"]["tolist"] > refs["wan"]["tolist"], results[0]["control"]


@pytest.mark.full
@pytest.mark.parametrize(("case", "dims"), FULL_RUNS, ids=[f"{c}-{d}" for c, d in FULL_RUNS])
def test_one_timestep_object_reads_nothing(results, refs, case, dims):
    """Wan at cfg=2 (the pair path, one timestep object for both calls): no more reads than diffusers'; all hits."""
    counted = results[0][(case, str(dims))]
    assert all(counted[kind] <= refs[case][kind] for kind in counted), (counted, refs[case])
    assert results[0][(case, str(dims), "stats")] == dict(batch=0, predicted=STEPS - 1, hits=STEPS - 1, whole=2)
