"""The tiny FLUX.1 pipeline (transformer, CLIP, T5) and the tiny Qwen-Image pipeline (transformer, Qwen2.5-VL)
sharded at tp=2 by `dtp.parallelize_pipeline`, on 2 gloo processes (one spawn for both), against the same
pipelines whole: prompt embeddings within 1e-5 relative, fp32 pixels within mean 1e-6 and a max bound (the
measured figures beside it). Negative control: a T5 query projection whose rank holds the other rank's rows
moves the image beyond them."""

from __future__ import annotations

import pytest
import torch

from dtp.testing.launch import spawn
from dtp.testing.pixels import MEAN_BOUND, pixel_error

ARGS = dict(prompt="a cat holding a sign that says hello", steps=2, height=32, width=32, seed=0)
EMBED_TOL = 1e-5  # prompt embeddings: max |sharded - ref| <= 1e-5 * max |ref|, fp32


def _relative(out, ref) -> float:
    return float((out - ref).abs().max() / ref.abs().max())


def _pipelines(build, mesh):
    """(whole, sharded, report): two copies of the pipeline from the same seeds, the second sharded."""
    import dtp

    ref, sharded = build(), build()
    for pipe in (ref, sharded):
        pipe.set_progress_bar_config(disable=True)
    return ref, sharded, dtp.parallelize_pipeline(sharded, mesh)


def _result(ref, sharded, report, embeds: dict) -> dict:
    from dtp.pipeline.generate import generate

    return {
        "report": {c.name: (c.plan, c.whole_bytes, c.local_bytes) for c in report.components},
        "table": str(report),
        "embeds": embeds,
        "ref": generate(ref, **ARGS)[0],
        "tp": generate(sharded, **ARGS)[0],
    }


def _flux(mesh) -> dict:
    from dtp.families.pipelines import tiny_flux_pipeline

    ref, sharded, report = _pipelines(tiny_flux_pipeline, mesh)
    out, want = sharded.encode_prompt(ARGS["prompt"], None)[:2], ref.encode_prompt(ARGS["prompt"], None)[:2]
    embeds = {
        "t5": _relative(out[0], want[0]),  # prompt_embeds: T5's last hidden state
        "clip": _relative(out[1], want[1]),  # pooled_prompt_embeds: CLIP's pooled output
    }
    result = _result(ref, sharded, report, embeds)
    result["wrong_slice"] = _wrong_slice_pixels(sharded, ref, mesh.get_local_rank("tp"))
    return result


WRONG_SLICE = "encoder.block.0.layer.0.SelfAttention.q"  # T5, colwise


def _wrong_slice_pixels(sharded, ref, rank: int):
    """Negative control: this rank's T5 query rows are the other rank's (an off-by-one rank in a text encoder)."""
    from dtp.pipeline.generate import generate

    weight = ref.text_encoder_2.get_submodule(WRONG_SLICE).weight.detach()
    sharded.text_encoder_2.get_submodule(WRONG_SLICE).weight.to_local().copy_(weight.chunk(2, dim=0)[1 - rank])
    return generate(sharded, **ARGS)[0]


def _qwenimage(mesh) -> dict:
    from dtp.families.pipelines import tiny_qwenimage_pipeline

    ref, sharded, report = _pipelines(tiny_qwenimage_pipeline, mesh)
    (out, out_mask), (want, want_mask) = sharded.encode_prompt(ARGS["prompt"]), ref.encode_prompt(ARGS["prompt"])
    # the mask is None when every token counts (one prompt): the same on both sides either way
    assert out.shape == want.shape and (out_mask is None) == (want_mask is None)
    assert out_mask is None or torch.equal(out_mask, want_mask)
    # prompt_embeds: Qwen2.5-VL's last hidden state over the prompt, the chat template's prefix dropped
    result = _result(ref, sharded, report, {"qwen2_5_vl": _relative(out, want)})
    result["language_model"] = (_language_model_bytes(ref.text_encoder), _language_model_bytes(sharded.text_encoder))
    return result


def _language_model_bytes(encoder) -> int:
    """This rank's bytes of Qwen2.5-VL's language model and LM head (its vision tower left out)."""
    from dtp.runtime.memory import local_param_bytes

    return local_param_bytes(encoder.model.language_model) + local_param_bytes(encoder.lm_head)


@torch.no_grad()
def _rank_job(rank: int, world_size: int) -> dict:
    import dtp

    mesh = dtp.make_mesh(tp=world_size)
    return {"flux": _flux(mesh), "qwenimage": _qwenimage(mesh)}


@pytest.fixture(scope="module")
def results():
    return spawn(_rank_job, 2)


def test_every_planned_component_is_sharded(results):
    """transformer and text encoders (CLIP, T5; Qwen2.5-VL) by their bundled plans; the VAEs split by rows
    (dtp.parallelize_vae)."""
    expected = {
        "flux": {"transformer": "flux", "text_encoder": "clip", "text_encoder_2": "t5", "vae": "rows"},
        "qwenimage": {"transformer": "qwenimage", "text_encoder": "qwen2_5_vl", "vae": "rows"},
    }
    for rank in results:
        for pipeline, plans in expected.items():
            assert {n: p for n, (p, _, _) in rank[pipeline]["report"].items()} == plans


# A rank's share of each encoder's bytes at tp=2. The pipeline's CLIP is narrower than the parity
# tests' (width 16, 1 layer): its 77 x 16 position table and norms, kept whole, are 21 % of it.
# Qwen2.5-VL (width 32, 1 layer): the qwen2_5_vl plan shards the language model, LM head and vision tower,
# but the tiny vision tower is mostly its patch embedding (a Conv3d kept whole: 75,264 of its 111,232
# bytes), so a rank holds 146,208 bytes (0.676); of the language model and LM head 52,736 of 105,088
# (0.502: norms whole).
SHARE = {
    ("flux", "text_encoder"): 0.61,
    ("flux", "text_encoder_2"): 0.55,
    ("qwenimage", "text_encoder"): 0.68,
}
LANGUAGE_MODEL_SHARE = 0.51


def test_text_encoders_hold_about_half(results):
    """tp=2: a rank holds <= 0.55 of tiny T5's bytes, <= 0.61 of tiny CLIP's, <= 0.68 of tiny Qwen2.5-VL's and
    <= 0.51 of its language model; the VAEs' weights stay whole (split by rows or not at all)."""
    print("\n" + "\n\n".join(results[0][p]["table"] for p in ("flux", "qwenimage")))
    for rank in results:
        for (pipeline, name), share in SHARE.items():
            _, whole, local = rank[pipeline]["report"][name]
            assert local <= share * whole, (pipeline, name, local, whole)
        whole, local = rank["qwenimage"]["language_model"]
        assert local <= LANGUAGE_MODEL_SHARE * whole, (local, whole)
        for pipeline in ("flux", "qwenimage"):
            _, whole, local = rank[pipeline]["report"]["vae"]
            assert local == whole


def test_prompt_embeddings_match(results):
    """T5 prompt embeddings, CLIP pooled embeddings and Qwen2.5-VL prompt embeddings at tp=2: within 1e-5 relative
    of the whole encoders."""
    for rank in results:
        embeds = {**rank["flux"]["embeds"], **rank["qwenimage"]["embeds"]}
        assert set(embeds) == {"t5", "clip", "qwen2_5_vl"}
        assert all(err <= EMBED_TOL for err in embeds.values()), embeds


MAX_BOUND = 2e-6  # max |pixel diff|: measured 4.8e-7 (FLUX.1), 3.6e-7 (Qwen-Image); means 6.9e-8, 5.7e-8


@pytest.mark.parametrize("pipeline", ["flux", "qwenimage"])
def test_image_matches_one_device(results, pipeline):
    """fp32 pixels in [0, 1]: mean |diff| <= 1e-6, max |diff| <= MAX_BOUND."""
    for rank in results:
        mean, worst = pixel_error(rank[pipeline]["tp"], rank[pipeline]["ref"])
        print(f"{pipeline} tp=2 pipeline: mean {mean:.2e} max {worst:.2e}")
        assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (mean, worst)


def test_wrong_text_encoder_slice_fails(results):
    """Negative control: one T5 query projection holding the other rank's rows misses both bounds."""
    for rank in results:
        mean, worst = pixel_error(rank["flux"]["wrong_slice"], rank["flux"]["ref"])
        print(f"flux, T5 q slice swapped: mean {mean:.2e} max {worst:.2e}")
        assert mean > 100 * MEAN_BOUND and worst > 100 * MAX_BOUND, (mean, worst)
