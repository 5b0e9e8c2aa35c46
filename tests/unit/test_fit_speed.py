"""`dtp fit`'s shortcuts give the rows the plain way gives: one sharded component traced at several shapes, the
shape keyed by what each component sees, call inputs built once; and fit's 3-D latents list is the parallel VAE's."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dtp.families.pipelines import tiny_checkpoint
from dtp.fit.measure import Measurer, Setup
from dtp.fit.pipelines import Shape, decode_inputs, fit_pipeline

SIDES = (64, 96)


def _counting(measurer: Measurer) -> Counter:
    """Count `measurer`'s traces by component (each call builds, shards and traces one model)."""
    counts, trace = Counter(), measurer._trace
    measurer._trace = lambda name, *args: counts.update([name]) or trace(name, *args)
    return counts


@pytest.fixture(scope="module")
def tiny_flux():
    return fit_pipeline(str(tiny_checkpoint("flux")))


def test_one_sharded_model_at_every_shape_gives_the_figures_of_one_trace_per_shape(tiny_flux):
    """Tiny FLUX.1 transformer at cp=2 (ring) quantized int8wo after sharding, 64^2 and 96^2: a Measurer told both
    shapes builds, shards, quantizes and traces it once for both and gives the figures (weights, peak, FLOPs,
    collectives, per shape) of a Measurer that does all of it for each shape on its own."""
    setup = Setup(cp=2, cp_mode="ring", quant="int8wo")
    shapes = tuple(Shape(1, side, side, 1, 32) for side in SIDES)
    shared = Measurer(tiny_flux, torch.float32, cache=False, shapes=shapes)
    alone = Measurer(tiny_flux, torch.float32, cache=False)
    counts, alone_counts = _counting(shared), _counting(alone)
    figures = [shared.phase("transformer", setup, s) for s in shapes]
    assert figures == [alone.phase("transformer", setup, s) for s in shapes]
    assert figures[0].peak_bytes < figures[1].peak_bytes and figures[0].flops < figures[1].flops
    assert (counts["transformer"], alone_counts["transformer"]) == (1, 2)


def test_text_encoders_see_the_prompt_and_vaes_the_latents(tiny_flux):
    """Shapes that differ only where a component does not look share its key (and so one trace)."""
    measurer = Measurer(tiny_flux, torch.float32, cache=False)
    a, b = Shape(1, 64, 64, 1, 32), Shape(2, 96, 128, 1, 32)
    assert measurer.relevant_shape("text_encoder", a) == measurer.relevant_shape("text_encoder", b)
    assert measurer.relevant_shape("vae", a) == measurer.relevant_shape("vae", Shape(3, 64, 64, 1, 77))
    assert measurer.relevant_shape("transformer", a) != measurer.relevant_shape("transformer", b)
    assert measurer.relevant_shape("transformer", a) != measurer.relevant_shape("transformer", Shape(1, 64, 64, 1, 77))


@pytest.mark.parametrize(
    ("class_name", "latents"),
    [
        # 17 frames at 256^2: 1 + 16 / 4 latent frames of 256 / 8 rows (HunyuanVideo, Wan: their configs' 4x, 8x)
        ("AutoencoderKLHunyuanVideo", (5, 32, 32)),
        ("AutoencoderKLWan", (5, 32, 32)),
        # LTX-Video: 8x in time, 32x in space (patch 4 x three 2x stages), from its config, not the others' 4x / 8x
        ("AutoencoderKLLTXVideo", (3, 8, 8)),
        # LTX-2's default config: patch 4 x four 2x stages in space (64x) and four in time (16x), from its config
        ("AutoencoderKLLTX2Video", (2, 4, 4)),
        pytest.param("AutoencoderKLHunyuanVideo15", (5, 16, 16), marks=pytest.mark.full),  # 16x in space, 4x in time
        # MiniMax-H3: per-level factors (16x in space, 4x in time), not 2 per level of its 6 block widths (32x)
        ("AutoencoderKLMiniMaxH3", (5, 16, 16)),
    ],
)
def test_video_vaes_decode_5d_latents_compressed_as_their_configs_say(class_name, latents):
    """Every VAE the parallel VAE treats as a video one gets [B, C, F, h, w] latents from fit, with the frames and
    rows its own config compresses the clip to (diffusers' `temporal_compression_ratio` / `spatial_compression_ratio`
    attributes of the built VAE are the reference)."""
    import diffusers

    with torch.device("meta"):
        vae = getattr(diffusers, class_name)()
    z = decode_inputs(vae, torch.bfloat16, Shape(1, 256, 256, 17))["z"]
    assert tuple(z.shape[2:]) == latents
    assert 256 // vae.spatial_compression_ratio == latents[1]
    if getattr(vae, "temporal_compression_ratio", None):
        assert 16 // vae.temporal_compression_ratio + 1 == latents[0]


def test_to_fake_keeps_tied_parameters_one_parameter():
    """T5's `shared` and `encoder.embed_tokens` are one table: after `to_fake` still one (counted once), as the real
    model holds it (tiny T5, vocab 192 x 32 fp32: 24 576 bytes of table, not 49 152)."""
    from dtp.analysis.trace import fake_mode, param_bytes_by_scope, to_fake
    from dtp.families.pipelines import t5_encoder

    with torch.device("meta"):
        model = t5_encoder(32, seed=0)
    assert model.shared.weight is model.encoder.embed_tokens.weight
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    with fake_mode():
        to_fake(model)
        counted = sum(param_bytes_by_scope(model).values())
    assert model.shared.weight is model.encoder.embed_tokens.weight
    assert model.shared.weight.device.type == "cpu"
    assert counted == whole


def test_a_shape_cp_does_not_divide_is_padded(tiny_flux):
    """Traced together, a shape whose 31 prompt tokens cp=2 does not divide is padded (FLUX.1's cp section pads
    its text and image splits: any sequence length, docs/cp.md) and both shapes trace; it was a ForwardError."""
    good, odd = Shape(1, 64, 64, 1, 32), Shape(1, 48, 16, 1, 31)
    measurer = Measurer(tiny_flux, torch.float32, cache=False, shapes=(good, odd))
    assert measurer.phase("transformer", Setup(cp=2), good).peak_bytes > 0
    assert measurer.phase("transformer", Setup(cp=2), odd).peak_bytes > 0
