"""Row-strip math of the parallel VAE (dtp/vae/strips.py); parallelize_vae checks that run before it mutates."""

from __future__ import annotations

import copy

import diffusers
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import dtp
from dtp.testing.tiny_vae import TINY_VAE_CONFIGS, tiny_vae
from dtp.vae import parallelize_vae
from dtp.vae.strips import bounds, conv_rows, scaled_bounds, split_rows


@given(st.integers(1, 300), st.integers(1, 16))
def test_split_rows_is_even_and_complete(total, parts):
    assume(total >= parts)
    counts = split_rows(total, parts)
    assert sum(counts) == total and len(counts) == parts
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1


def test_split_rows_example():
    assert split_rows(13, 4) == (4, 3, 3, 3)
    assert bounds((4, 3, 3, 3)) == (0, 4, 7, 10, 13)
    assert scaled_bounds((4, 3, 3, 3), 2, 24) == (0, 32, 56, 80, 104)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 5),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from(
        [(1, 1, 1, 0, 0), (3, 1, 1, 1, 1), (3, 2, 1, 0, 1), (5, 1, 2, 4, 4), (4, 2, 1, 1, 1), (3, 1, 1, 2, 0)]
    ),
)
def test_strips_compute_the_untiled_conv_rows(latent, world, factor, conv):
    """Every rank's window of the padded input, convolved alone, gives exactly its rows of the whole conv;
    the ranks' rows tile the output. Independent of the formula: a real conv1d over a random signal."""
    assume(latent >= world)
    kernel, stride, dilation, pad_top, pad_bottom = conv
    assume(factor % stride == 0 and (factor // stride) * latent * stride == factor * latent)
    in_bounds = scaled_bounds(split_rows(latent, world), 0, split_rows(latent, world)[0] * factor)
    signal = torch.randn(1, 1, in_bounds[-1], dtype=torch.float64)
    weight = torch.randn(1, 1, kernel, dtype=torch.float64)
    padded = F.pad(signal, (pad_top, pad_bottom))
    whole = F.conv1d(padded, weight, stride=stride, dilation=dilation)
    pieces = []
    for rank in range(world):
        rows = conv_rows(
            in_bounds, rank, kernel=kernel, stride=stride, dilation=dilation, pad_top=pad_top, pad_bottom=pad_bottom
        )
        first = in_bounds[rank] - rows.top + pad_top  # in padded coordinates
        last = in_bounds[rank + 1] + rows.bottom + pad_top
        assert rows.zeros_top == max(0, pad_top - first) and rows.zeros_bottom == max(0, last - pad_top - in_bounds[-1])
        piece = F.conv1d(padded[..., first:last], weight, stride=stride, dilation=dilation)
        assert piece.shape[-1] == rows.out[1] - rows.out[0]
        # conv1d takes another kernel path on a shorter input: float64 sums differ in the last bits (1.8e-15
        # measured over lengths 2..40); a window one row off is O(1) away.
        torch.testing.assert_close(piece, whole[..., rows.out[0] : rows.out[1]], rtol=0, atol=1e-12)
        pieces.append(piece)
    torch.testing.assert_close(torch.cat(pieces, -1), whole, rtol=0, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 5),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([(3, 1, 1, 1, 1), (3, 2, 1, 1, 1), (5, 1, 1, 2, 2), (5, 1, 2, 4, 4), (3, 2, 1, 0, 1)]),
)
def test_reflect_padded_strip_windows_are_the_untiled_ones(latent, world, factor, conv):
    """LTX-2's reflect-padded convs: each rank's window (its strip, the halo rows its neighbours send, the image's
    own rows mirrored at its top / bottom edge) is exactly that rank's window of F.pad(mode="reflect") of the whole
    signal, uneven strips and stride 2 included. Independent of the formula: torch's own reflect padding."""
    from dtp.vae.conv import _reflect_rows
    from dtp.vae.halo import halo_counts

    assume(latent >= world)
    kernel, stride, dilation, pad_top, pad_bottom = conv
    assume(factor % stride == 0)
    in_bounds = scaled_bounds(split_rows(latent, world), 0, split_rows(latent, world)[0] * factor)
    assume(in_bounds[-1] > max(pad_top, pad_bottom))  # torch's reflect padding needs as much
    signal = torch.randn(1, 1, in_bounds[-1], dtype=torch.float64)
    padded = F.pad(signal, (pad_top, pad_bottom), mode="reflect")
    for rank in range(world):
        rows = conv_rows(
            in_bounds, rank, kernel=kernel, stride=stride, dilation=dilation, pad_top=pad_top, pad_bottom=pad_bottom
        )
        i0, i1 = in_bounds[rank], in_bounds[rank + 1]
        from_above, from_below = halo_counts(rows)
        above = signal[..., i0 - from_above : i0] if from_above else None
        below = signal[..., i1 : i1 + from_below] if from_below else None
        own = signal[..., i0 + max(0, -rows.top) : i1 - max(0, -rows.bottom)]
        window = _reflect_rows(own, above, below, rows, 2)
        expected = padded[..., i0 - rows.top + pad_top : i1 + rows.bottom + pad_top]
        assert torch.equal(window, expected), (rank, rows)


def test_unknown_vae_class_is_refused_untouched():
    """An unsupported class: PlanError naming it, before anything changes."""
    vae = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, padding=1))
    with pytest.raises(dtp.PlanError, match="Sequential is not supported"):
        parallelize_vae(vae, object())
    assert "forward" not in vae[0].__dict__


def test_unknown_layer_is_refused_untouched():
    """An AutoencoderKL with a layer the split has no rule for (a reflect-padded conv): PlanError naming
    the layer, and no forward replaced anywhere."""
    vae = tiny_vae("AutoencoderKL")
    vae.decoder.conv_out.padding_mode = "reflect"
    before = copy.deepcopy(vae.state_dict())
    with pytest.raises(dtp.PlanError, match="decoder.conv_out pads"):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())
    assert getattr(vae, "_dtp_vae", None) is None
    assert all(torch.equal(before[k], v) for k, v in vae.state_dict().items())


def test_ltx_noise_injection_is_refused_untouched():
    """LTX's decoder_inject_noise draws torch.randn(H, W) per call over the whole image: a strip would draw other
    numbers, so it is refused (naming the resnet and the reason) before anything changes."""
    config = dict(TINY_VAE_CONFIGS["AutoencoderKLLTXVideo"], decoder_inject_noise=(True,) * 4)
    vae = diffusers.AutoencoderKLLTXVideo(**config).eval()
    with pytest.raises(dtp.PlanError, match=r"decoder\.mid_block\.resnets\.0 .*inject_noise"):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())


def test_hunyuan_reflect_padding_is_refused_untouched():
    """A HunyuanVideo causal conv padded other than replicate / zeros has no strip rule: PlanError naming it."""
    vae = tiny_vae("AutoencoderKLHunyuanVideo")
    vae.decoder.conv_out.pad_mode = "reflect"
    with pytest.raises(dtp.PlanError, match=r"decoder\.conv_out .*pad_mode='reflect'"):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())


def test_wan_post_quant_conv_with_a_kernel_is_refused_untouched():
    """Wan's `_decode` is split above post_quant_conv, which must then be row-local (1 x 1 x 1): a 3 x 3 x 3 one is
    refused, naming it, before any forward or `_decode` is replaced."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    vae = tiny_vae("AutoencoderKLWan")
    vae.post_quant_conv = WanCausalConv3d(4, 4, 3, padding=1)
    with pytest.raises(dtp.PlanError, match=r"AutoencoderKLWan runs a post_quant_conv with kernel \(3, 3, 3\)"):
        parallelize_vae(vae, object())
    assert not any({"forward", "_decode"} & set(m.__dict__) for m in vae.modules())


def test_an_unknown_leaf_is_refused_naming_it():
    """A leaf no rule of the table matches (a PixelShuffle planted in the decoder): PlanError naming its path."""
    vae = tiny_vae("AutoencoderKL")
    vae.decoder.conv_act = torch.nn.PixelShuffle(1)
    with pytest.raises(dtp.PlanError, match=r"decoder\.conv_act \(PixelShuffle\) has no row-strip rule"):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())


def test_every_rule_of_the_table_covers_a_layer_of_a_tiny_vae():
    """No dead row in `STRIP_RULES`: each rule matches some layer of the tiny VAEs (one per supported class and
    version), so each is exercised by the parity tests that run them."""
    from dtp.vae.strip_rules import STRIP_RULES, checked_layers

    used = set()
    for name in TINY_VAE_CONFIGS:
        vae = tiny_vae(name)
        for part in ("encoder", "decoder"):
            used |= {rule.name for _, _, rule in checked_layers(getattr(vae, part), part)}
    assert [rule.name for rule in STRIP_RULES if rule.name not in used] == []


def test_ltx2_circular_padding_and_noise_injection_are_refused_untouched():
    """LTX-2's VAE: a circular spatial padding wraps the image's last row onto its first (a whole-height op), and
    decoder_inject_noise draws torch.randn(H, W) over the whole image: each is refused with a PlanError naming the
    layer and the reason, before anything changes."""
    vae = tiny_vae("AutoencoderKLLTX2Video")
    vae.decoder.conv_out.conv.padding_mode = "circular"
    with pytest.raises(dtp.PlanError, match=r"decoder\.conv_out \(LTX2VideoCausalConv3d\) .*'circular'"):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())
    config = dict(TINY_VAE_CONFIGS["AutoencoderKLLTX2Video"], decoder_inject_noise=(True,) * 4)
    vae = diffusers.AutoencoderKLLTX2Video(**config).eval()
    with pytest.raises(dtp.PlanError, match=r"decoder\.mid_block\.resnets\.0 .*inject_noise"):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())


def test_minimax_circular_padding_is_refused_untouched():
    """MiniMax-H3's encoder convs with a circular spatial padding (the image's last row wrapped onto its first): a
    PlanError naming the conv and the mode, before anything changes."""
    vae = tiny_vae("AutoencoderKLMiniMaxH3")
    vae.encoder.conv_in.spatial_padding_mode = "circular"
    with pytest.raises(dtp.PlanError, match=r"encoder\.conv_in \(MiniMaxH3VideoCausalConv3d\) .*'circular'"):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())
