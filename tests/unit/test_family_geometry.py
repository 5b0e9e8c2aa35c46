"""Each family's geometry (`dtp/families/geometry.py`) is the one home of its pixels per token, VAE factors, usual clip
and CFG calls: check and fit read it, and a family module that declares none gets the image default."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dtp
from dtp import PlanError
from dtp.analysis.inputs import ForwardShape, forward_inputs, full_inputs, latent_grid
from dtp.families import FAMILIES, family_of
from dtp.families.geometry import IMAGE, Geometry
from dtp.fit.pipelines import fit_pipeline
from dtp.testing.tiny import TINY_CONFIGS

VIDEO = sorted(name for name, f in FAMILIES.items() if f.geometry.is_video)


def test_a_family_without_geometry_is_an_image_dit():
    module = SimpleNamespace(CLASS_NAME="NewTransformer2DModel", PLAN="new", TINY={}, RELEASED={}, inputs=print)
    assert family_of(module).geometry == IMAGE and IMAGE.pixels_per_token == 16 and not IMAGE.is_video


# Video models whose class name does not say so (Cosmos 3 Omni generates video from one packed sequence).
VIDEO_NAMED_OTHERWISE = {"Cosmos3OmniTransformer"}


def test_video_families_are_the_3d_transformers():
    assert sorted(name for name in FAMILIES if "3DModel" in name or name in VIDEO_NAMED_OTHERWISE) == VIDEO


@pytest.mark.parametrize("class_name", ["SanaTransformer2DModel", "HunyuanImageTransformer2DModel"])
def test_32x_vaes_give_32_pixels_per_token(class_name):
    """Sana's DC-AE and HunyuanImage 2.1's VAE compress 32x with patch 1 (diffusers' pipelines: vae_scale_factor 32):
    a 1024^2 image is a 32 x 32 latent, 1024 tokens (the old fixed 16 px per token made it 4096)."""
    inputs = forward_inputs(class_name, TINY_CONFIGS[class_name], torch.float32, ForwardShape(resolution=1024))
    assert inputs.tokens == 1024 and tuple(inputs.kwargs["hidden_states"].shape[-2:]) == (32, 32)
    with pytest.raises(PlanError, match="multiple of 32"):
        forward_inputs(class_name, TINY_CONFIGS[class_name], torch.float32, ForwardShape(resolution=1040))


def test_fit_reads_the_geometry():
    """`dtp fit`'s frames, calls per step and video-ness come from the transformer's family."""
    wan, flux, qwen = (fit_pipeline(f"{n}-pipeline") for n in ("wan", "flux", "qwenimage"))
    assert (wan.usual_frames, wan.calls_per_step, wan.is_video) == (81, 2, True)
    assert (flux.usual_frames, flux.calls_per_step, flux.is_video) == (None, 1, False)
    assert qwen.calls_per_step == 2


@given(st.sampled_from(VIDEO), st.integers(0, 6), st.integers(1, 4), st.integers(1, 4))
def test_latent_video_is_whole_tokens(class_name, k, rows, cols):
    """Any clip of 1 + t k frames and a multiple of the pixels per token on each side: whole latent frames, and the
    latent grid times the VAE's factors gives the clip back."""
    g = FAMILIES[class_name].geometry
    size = (1 + g.vae_time_scale * k, rows * g.pixels_per_token, cols * g.pixels_per_token)
    f, h, w = latent_grid(class_name, size)
    assert ((f - 1) * g.vae_time_scale + 1, h * g.vae_scale, w * g.vae_scale) == size
    assert h % g.patch == 0 and w % g.patch == 0


def test_image_tokens_for_a_non_square_image():
    """FLUX.1 at 768 x 1360 (fit's --height / --width): 48 x 85 tokens of 16 px."""
    flux = "FluxTransformer2DModel"
    inputs = full_inputs(flux, TINY_CONFIGS[flux], torch.float32, height=768, width=1360, text_tokens=8)
    assert inputs.tokens == 48 * 85 and inputs.kwargs["hidden_states"].shape[1] == 48 * 85


def test_geometry_refuses_a_video_layout_without_a_clip():
    with pytest.raises(AssertionError):
        Geometry(layout="video")


@pytest.mark.parametrize(
    ("pipeline", "size"),
    [
        ("wan-pipeline", (720, 1280, 81)),
        ("flux-pipeline", (1024, 1024, None)),
        ("qwenimage-pipeline", (1024, 1024, None)),
    ],
)
def test_fit_sizes_a_generation_at_the_pipelines_usual_size(pipeline, size):
    """Without --resolution / --height / --width, `dtp fit` sizes Wan2.1-T2V-14B at its 720p x 81 (not 1024²) and the
    image pipelines at 1024² (`only` keeps no candidate: nothing is measured)."""
    report = dtp.fit(pipeline, 1, "80GB", only={"tp": 3})
    assert (report["height"], report["width"], report["frames"]) == size


def test_an_explicit_resolution_wins_over_the_usual_size():
    report = dtp.fit("wan-pipeline", 1, "80GB", resolution=512, only={"tp": 3})
    assert (report["height"], report["width"], report["frames"]) == (512, 512, 81)
