"""Issue 35's VAEs (AutoencoderDC, AutoencoderKLCogVideoX, AutoencoderKLMagvit) before and around the split: the
layers without an exact strip rule are refused naming their path and reason, with nothing changed; eval-only
BatchNorm refuses a training call; `dtp fit`'s decode phase builds their latents and traces their parallel decode on a
fake world."""

from __future__ import annotations

import copy

import diffusers
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.analysis.trace import fake_mode, to_fake, trace_call
from dtp.fit.pipelines import Shape, decode, decode_inputs, vae_scale
from dtp.runtime.mesh import make_mesh
from dtp.testing.tiny_vae import tiny_vae
from dtp.vae import parallelize_vae
from dtp.vae.strips import bounds, split_rows


def _refused(vae, match: str) -> None:
    """parallelize_vae raises a PlanError matching `match`; no forward replaced, no state attached."""
    with pytest.raises(dtp.PlanError, match=match):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())
    assert getattr(vae, "_dtp_vae", None) is None


def test_dc_batch_norm_without_running_stats_is_refused():
    """A BatchNorm2d that always normalises by batch statistics: a strip's are not the image's."""
    vae = tiny_vae("AutoencoderDC")
    norm = vae.decoder.up_blocks[0][1].norm
    norm.track_running_stats, norm.running_mean, norm.running_var = False, None, None
    _refused(vae, r"decoder\.up_blocks\.0\.1\.norm \(BatchNorm2d\) .*batch statistics without running statistics")


def test_dc_bilinear_upsampling_is_refused():
    """DCUpBlock2d interpolating other than nearest mixes rows across strip edges."""
    vae = tiny_vae("AutoencoderDCConv")
    vae.decoder.up_blocks[1][0].interpolation_mode = "bilinear"
    _refused(vae, r"decoder\.up_blocks\.1\.0 \(DCUpBlock2d\) .*interpolation 'bilinear'")


def test_dc_attention_with_another_processor_is_refused():
    """The strip rule is SanaMultiscaleAttnProcessor2_0's math; any other processor is named and refused."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    vae = tiny_vae("AutoencoderDC")
    vae.encoder.down_blocks[2][0].attn.processor = AttnProcessor2_0()
    _refused(vae, r"encoder\.down_blocks\.2\.0\.attn \(SanaMultiscaleLinearAttention\) .*processor AttnProcessor2_0")


def test_cogvideox_replicate_padding_is_refused():
    """CogVideoXCausalConv3d with pad_mode='replicate' (Mochi's use of the class) has no rule here."""
    config = dict(tiny_vae("AutoencoderKLCogVideoX").config)
    vae = diffusers.AutoencoderKLCogVideoX.from_config(config)
    vae.decoder.conv_in.pad_mode = "replicate"
    _refused(vae, r"decoder\.conv_in \(CogVideoXCausalConv3d\) .*pad_mode='replicate'")


def test_magvit_reflect_padding_is_refused():
    """An EasyAnimateCausalConv3d padded other than with zeros has no strip rule."""
    vae = tiny_vae("AutoencoderKLMagvit")
    vae.encoder.conv_in.padding_mode = "reflect"
    _refused(vae, r"encoder\.conv_in \(EasyAnimateCausalConv3d\) .*padding_mode='reflect'")


def test_dc_batch_norm_in_training_mode_refuses_the_call():
    """Eval-mode BatchNorm2d is row-local; called in training mode it would use the strip's statistics: ForwardError."""
    vae = tiny_vae("AutoencoderDC")
    with fake_world(2):
        parallelize_vae(vae, make_mesh(tp=2, device_type="cpu"))
        vae.train()
        with pytest.raises(dtp.ForwardError, match="BatchNorm2d in training mode"), torch.no_grad():
            vae.decode(torch.randn(1, 4, 4, 4))


def test_fit_reads_the_dc_scale():
    """Sana's DC-AE (diffusers' default AutoencoderDC config) compresses 32x, as SanaPipeline's vae_scale_factor."""
    with torch.device("meta"):
        vae = diffusers.AutoencoderDC()
    assert vae_scale(vae.config) == vae.spatial_compression_ratio == 32


@pytest.mark.parametrize(
    "cls, latent",
    [
        ("AutoencoderDC", (1, 4, 8, 6)),
        ("AutoencoderKLCogVideoX", (1, 4, 5, 8, 6)),
        pytest.param("AutoencoderKLMagvit", (1, 4, 9, 8, 6), marks=pytest.mark.full),
        ("AutoencoderKLMochi", (1, 4, 9, 8, 6)),
        pytest.param("AutoencoderKLAllegro", (1, 4, 9, 8, 6), marks=pytest.mark.full),
        pytest.param("AutoencoderKLCosmos", (1, 4, 5, 4, 3), marks=pytest.mark.full),
    ],
)
def test_fit_traces_the_split_decode(cls, latent):
    """`dtp fit`'s decode phase: latents of the VAE's layout and scale for a 32 x 24 (17-frame) request; the decode
    split over 2 fake ranks has collectives and a lower activation peak than the whole decode (Allegro's tiled decode:
    0.876 measured, its stitched tiles and video are whole on every rank, as MiniMax-H3's tiled peak)."""
    with torch.device("meta"):
        template = tiny_vae(cls)
    z = decode_inputs(template, torch.float32, Shape(batch=1, height=32, width=24, frames=17))["z"]
    assert tuple(z.shape) == latent
    peaks, collectives = {}, {}
    for split in (1, 2):
        vae = copy.deepcopy(template)
        with fake_world(split):
            if split > 1:
                parallelize_vae(vae, make_mesh(tp=split, device_type="cpu"))
            with fake_mode():
                to_fake(vae)
                trace = trace_call(vae, decode, {"z": torch.empty(latent)})
        peaks[split], collectives[split] = trace.peak_bytes, len(trace.collectives)
    assert collectives[1] == 0 < collectives[2]
    bound = 0.95 if cls == "AutoencoderKLAllegro" else 0.8
    assert peaks[2] < bound * peaks[1], peaks  # measured: 0.577 (DC), 0.508 (CogVideoX), 0.602 (Magvit)


@given(st.integers(1, 96), st.integers(1, 8), st.sampled_from([1, 2, 4, 8]), st.integers(1, 3))
def test_nearest_interpolation_of_a_strip_is_the_strip_of_the_whole(latent, world, scale, frames):
    """CogVideoX's spatial norm interpolates the latent (nearest, to the activation's size) on each strip: for a power
    of 2 ratio the strips' results are exactly the rows of the whole image's, for any row split (torch's kernel; the
    rule relies on it). Each latent row is its own index, so a row taken from the wrong place shows."""
    assume(latent >= world)
    z = torch.arange(latent, dtype=torch.float32).view(1, 1, 1, latent, 1).expand(1, 2, frames, latent, 3)
    whole = F.interpolate(z, size=(frames, latent * scale, 3))
    b = bounds(split_rows(latent, world))
    strips = [
        F.interpolate(z[:, :, :, b[r] : b[r + 1]], size=(frames, (b[r + 1] - b[r]) * scale, 3)) for r in range(world)
    ]
    assert torch.equal(torch.cat(strips, dim=3), whole)
