"""End to end on CPU (gloo, 2 ranks): sharded diffusers pipelines generate the image of one device.

One process group for the module: every rank generates with the unsharded pipeline (the reference)
and with the tp=2 one, for the tiny FLUX.1 and Qwen-Image checkpoints (written by dtp.families.pipelines,
loaded from disk; the prompt goes through their random CLIP + T5 / Qwen2.5-VL text encoders). fp32 pixels
within mean 1e-6 and a max bound beside each test (the measured figures); negative controls a plausible bug
trips: a tp rank holding the other rank's slice of one colwise projection, and ring attention dropping every
block it receives (a missing exchange: each rank attends to its own keys only).
"""

from __future__ import annotations

import filecmp

import numpy as np
import pytest
import torch

from dtp.families.pipelines import CHECKPOINTS, tiny_checkpoint
from dtp.testing.launch import spawn
from dtp.testing.pixels import MEAN_BOUND, pixel_error

MODELS = ["flux", "qwenimage"]  # tiny checkpoint name = bundled plan name
ARGS = dict(prompt="a cat holding a sign that says hello", steps=3, height=32, width=32, seed=0)


def _rank_job(rank: int, world_size: int, model_dirs: dict) -> dict:
    import dtp
    from dtp.pipeline.generate import generate
    from dtp.runtime.memory import local_param_bytes

    mesh = dtp.make_mesh(tp=world_size)
    cp_mesh = dtp.make_mesh(tp=1, cp=world_size)
    cp_calls = _count_cp_attention_calls()
    cpu, fp32 = torch.device("cpu"), torch.float32
    out = {}
    for name, model_dir in model_dirs.items():
        ref = dtp.load_pipeline(model_dir, torch_dtype=fp32, device=cpu)
        sharded = dtp.load_pipeline(model_dir, mesh, torch_dtype=fp32, plans={"transformer": name}, device=cpu)
        ref.set_progress_bar_config(disable=True)
        sharded.set_progress_bar_config(disable=True)
        out[f"{name}_ref"] = generate(ref, **ARGS)[0]
        out[f"{name}_tp"] = generate(sharded, **ARGS)[0]
        out[f"{name}_bytes"] = (local_param_bytes(ref.transformer), local_param_bytes(sharded.transformer))
        out[f"{name}_expected_bytes"] = _expected_local_bytes(ref.transformer, dtp.load_plan(name), world_size)
        out[f"{name}_wrong_slice"] = _wrong_slice_pixels(sharded, ref, rank)
        # The same pipeline with the sequence split over 2 ranks (cp=2, tp=1), both CP modes.
        for mode in ("ulysses", "ring"):
            cp_pipe = dtp.load_pipeline(
                model_dir, cp_mesh, torch_dtype=fp32, plans={"transformer": name}, cp_mode=mode, device=cpu
            )
            cp_pipe.set_progress_bar_config(disable=True)
            before = cp_calls["n"]
            out[f"{name}_cp_{mode}"] = generate(cp_pipe, **ARGS)[0]
            out[f"{name}_cp_{mode}_calls"] = cp_calls["n"] - before
        out[f"{name}_ring_local_keys"] = _local_keys_pixels(cp_pipe)
    return out


WRONG_SLICE = "transformer_blocks.0.attn.to_q"


def _wrong_slice_pixels(sharded, ref, rank: int):
    """Negative control: this rank's colwise to_q of block 0 holds the other rank's rows (an off-by-one rank)."""
    from dtp.pipeline.generate import generate

    module = sharded.transformer.get_submodule(WRONG_SLICE)
    weight = ref.transformer.get_submodule(WRONG_SLICE).weight.detach()
    with torch.no_grad():
        module.weight.to_local().copy_(weight.chunk(2, dim=0)[1 - rank])
    return generate(sharded, **ARGS)[0]


def _local_keys_pixels(ring_pipe):
    """Negative control: ring attention keeping its own block and dropping every block it receives."""
    import dtp.runtime.cp.ring as ring
    from dtp.pipeline.generate import generate

    real = ring.merge
    ring.merge = lambda out_a, lse_a, out_b, lse_b, **unused: (out_a, lse_a)
    try:
        return generate(ring_pipe, **ARGS)[0]
    finally:
        ring.merge = real


def _expected_local_bytes(model, plan, tp: int) -> int:
    """One rank's parameter bytes counted from the plan, without DTensor: sharded tensors / tp, the rest whole."""
    from dtp.resolve import resolve

    layouts = resolve(plan, model).param_layouts()
    return sum(
        p.numel() * p.element_size() // (tp if layouts.get(name) is not None else 1)
        for name, p in model.named_parameters()
    )


def _count_cp_attention_calls() -> dict:
    """Count CP attention calls in this worker, so a CP run that silently attends locally fails."""
    from dtp.runtime.cp.attention import CpAttention

    calls, original = {"n": 0}, CpAttention.__call__

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return original(self, *args, **kwargs)

    CpAttention.__call__ = counting
    return calls


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    return {name: tiny_checkpoint(name, root) for name in MODELS}


@pytest.fixture(scope="module")
def results(model_dirs):
    return spawn(_rank_job, 2, {name: str(path) for name, path in model_dirs.items()})


MAX_BOUND = 2e-6  # max |pixel diff| of every tp and cp image: measured 4.8e-7 (FLUX.1 cp=2), 1.8e-7 (Qwen-Image)


@pytest.mark.parametrize("name", MODELS)
def test_tp2_image_matches_one_device(results, name):
    """FLUX.1 and Qwen-Image tiny, tp=2 vs unsharded, fp32: mean <= 1e-6, max <= MAX_BOUND."""
    for rank in results:
        mean, worst = pixel_error(rank[f"{name}_tp"], rank[f"{name}_ref"])
        print(f"{name} tp=2: mean {mean:.2e} max {worst:.2e}")
        assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (name, mean, worst)


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
@pytest.mark.parametrize("name", MODELS)
def test_cp2_image_matches_one_device(results, name, mode):
    """FLUX.1 and Qwen-Image tiny, sequence split over cp=2 (tp=1), Ulysses and ring: same pixel bounds as tp=2."""
    for rank in results:
        mean, worst = pixel_error(rank[f"{name}_cp_{mode}"], rank[f"{name}_ref"])
        print(f"{name} cp=2 {mode}: mean {mean:.2e} max {worst:.2e}")
        assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (name, mode, mean, worst)
        assert rank[f"{name}_cp_{mode}_calls"] > 0, "CP attention never ran"


@pytest.mark.parametrize("control", ["wrong_slice", "ring_local_keys"])
@pytest.mark.parametrize("name", MODELS)
def test_plausible_bugs_fail_the_bounds(results, name, control):
    """Negative controls: one rank's slice of one colwise projection swapped with the other rank's, and ring
    attention over local keys only, each move the image beyond both bounds (the max by 10x)."""
    for rank in results:
        mean, worst = pixel_error(rank[f"{name}_{control}"], rank[f"{name}_ref"])
        print(f"{name} {control}: mean {mean:.2e} max {worst:.2e}")
        assert mean > MEAN_BOUND and worst > 10 * MAX_BOUND, (name, control, mean, worst)


@pytest.mark.parametrize("name", MODELS)
def test_every_rank_generates_the_same_image(results, name):
    """Same seeded latents and all-reduced activations: rank 1's image is rank 0's, bit for bit."""
    np.testing.assert_array_equal(results[0][f"{name}_tp"], results[1][f"{name}_tp"])


def test_images_are_not_blank(results):
    """The comparison means something only if the pixels vary and are mostly not clipped."""
    for name in MODELS:
        pixels = results[0][f"{name}_ref"]
        assert pixels.std() > 0.03 and ((pixels > 0) & (pixels < 1)).mean() > 0.9, name


@pytest.mark.parametrize("name", MODELS)
def test_sharded_transformer_holds_exactly_its_share(results, name):
    """Each rank's transformer bytes at tp=2 equal the plan's share (sharded / 2 + replicated), counted
    independently of DTensor; FLUX.1 tiny measured 980,928 of 1,846,592 bytes (0.531)."""
    for rank in results:
        whole, local = rank[f"{name}_bytes"]
        assert local == rank[f"{name}_expected_bytes"] < whole, (local, rank[f"{name}_expected_bytes"], whole)


@pytest.mark.parametrize("name", MODELS)
def test_checkpoint_creation_is_deterministic(model_dirs, tmp_path, name):
    """A second first-use creation writes byte-identical weights, configs and tokenizer files."""
    first, again = model_dirs[name], tiny_checkpoint(name, tmp_path)
    assert again.name == first.name == CHECKPOINTS[name][0]
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    mismatched = [f for f in files if not filecmp.cmp(first / f, again / f, shallow=False)]
    assert not mismatched, mismatched
