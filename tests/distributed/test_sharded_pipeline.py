"""The tiny FLUX.1 pipeline with its transformer and both text encoders (CLIP, T5) sharded at tp=2 by
`dtp.parallelize_pipeline`, on 2 gloo processes, against the same pipeline whole."""

from __future__ import annotations

import pytest
import torch

from dtp.testing.launch import spawn
from dtp.tools.demo import compare

ARGS = dict(prompt="a cat holding a sign that says hello", steps=2, height=32, width=32, seed=0)
EMBED_TOL = 1e-5  # prompt embeddings: max |sharded - ref| <= 1e-5 * max |ref|, fp32


def _relative(out, ref) -> float:
    return float((out - ref).abs().max() / ref.abs().max())


@torch.no_grad()
def _rank_job(rank: int, world_size: int) -> dict:
    import dtp
    from dtp.testing.pipelines import tiny_flux_pipeline
    from dtp.tools.run import generate

    mesh = dtp.make_mesh(tp=world_size)
    ref, sharded = tiny_flux_pipeline(), tiny_flux_pipeline()
    for pipe in (ref, sharded):
        pipe.set_progress_bar_config(disable=True)
    report = dtp.parallelize_pipeline(sharded, mesh)
    embeds = [sharded.encode_prompt(ARGS["prompt"], None)[:2], ref.encode_prompt(ARGS["prompt"], None)[:2]]
    return {
        "report": {c.name: (c.plan, c.whole_bytes, c.local_bytes) for c in report.components},
        "table": str(report),
        "t5": _relative(embeds[0][0], embeds[1][0]),  # prompt_embeds: T5's last hidden state
        "clip": _relative(embeds[0][1], embeds[1][1]),  # pooled_prompt_embeds: CLIP's pooled output
        "ref": generate(ref, **ARGS)[0],
        "tp": generate(sharded, **ARGS)[0],
    }


@pytest.fixture(scope="module")
def results():
    return spawn(_rank_job, 2)


def test_every_planned_component_is_sharded(results):
    """transformer, text_encoder (CLIP), text_encoder_2 (T5) by their bundled plans; the VAE stays whole."""
    report = results[0]["report"]
    assert {n: p for n, (p, _, _) in report.items()} == {
        "transformer": "flux",
        "text_encoder": "clip",
        "text_encoder_2": "t5",
        "vae": None,
    }


# A rank's share of each encoder's bytes at tp=2. The pipeline's CLIP is narrower than the parity
# tests' (width 16, 1 layer): its 77 x 16 position table and norms, kept whole, are 21 % of it.
SHARE = {"text_encoder": 0.61, "text_encoder_2": 0.55}


def test_text_encoders_hold_about_half(results):
    """Tiny T5 at tp=2: a rank holds <= 0.55 of its bytes, tiny CLIP <= 0.61; the VAE stays whole."""
    print("\n" + results[0]["table"])
    for rank in results:
        for name, share in SHARE.items():
            _, whole, local = rank["report"][name]
            assert local <= share * whole, (name, local, whole)
        _, whole, local = rank["report"]["vae"]
        assert local == whole


def test_prompt_embeddings_match(results):
    """T5 prompt embeddings and CLIP pooled embeddings at tp=2: within 1e-5 relative of the whole encoders."""
    for rank in results:
        assert rank["t5"] <= EMBED_TOL and rank["clip"] <= EMBED_TOL, (rank["t5"], rank["clip"])


def test_image_matches_one_device(results):
    """Pixels in [0, 1]: mean |diff| <= 1e-3 and p99 <= 1e-2 (the demo's tolerances, dtp.tools.demo.compare)."""
    for rank in results:
        mean, p99, ok = compare(rank["tp"], rank["ref"])
        assert ok, (mean, p99)
