"""Issue 45's VAEs (AutoencoderKLMochi, AutoencoderKLAllegro, AutoencoderKLCosmos) around the split: why Cosmos's Haar
patching needs no halo (row-local on strips whose bounds are multiples of the patch size, wrong on others), the layers
without an exact strip rule refused naming their path and reason with nothing changed, Mochi's framewise switch
refused at the call, and `dtp fit`'s trace of each split decode on a fake world."""

from __future__ import annotations

import pytest
import torch

import dtp
from dtp.testing.tiny_vae import tiny_vae
from dtp.vae import mochi, parallelize_vae


def _by_strips(layer, x: torch.Tensor, cuts: tuple[int, ...]) -> torch.Tensor:
    """`layer` run on each strip of rows [cuts[i], cuts[i + 1]) of x (B, C, T, H, W), the strips concatenated."""
    return torch.cat([layer(x[:, :, :, a:b]) for a, b in zip(cuts, cuts[1:])], dim=3)


def test_haar_patching_is_row_local_on_aligned_strips_only():
    """CosmosPatchEmbed3d (haar, and the plain rearrangement) on strips whose bounds are multiples of the patch size,
    concatenated, equals the whole input's patching (measured: bit for bit): its 2-tap stride-2 filters (and the
    reflect pad of one bottom row, never read over an even height) keep every output row inside its strip; the
    unpatcher's transposed filters likewise for any split of its rows. Negative control: a bound that is odd, or 2 mod 4
    at patch 4, puts a wavelet window across two strips and the result differs (why the encoder's input is split in
    multiples of the patch size times the downsamplings: `height_stride`). A fixed case (diffusers' grouped conv3d calls
    take ~0.1 s each on CPU, whatever the size): patch 4, 16 rows, 5 frames (the first repeated to a whole patch)."""
    from diffusers.models.autoencoders.autoencoder_kl_cosmos import CosmosPatchEmbed3d, CosmosUnpatcher3d

    x = torch.randn(1, 3, 5, 16, 8, generator=torch.Generator().manual_seed(0))
    for method in ("rearrange", "haar"):
        embed = CosmosPatchEmbed3d(4, method)
        whole = embed(x)
        torch.testing.assert_close(_by_strips(embed, x, (0, 8, 12, 16)), whole, rtol=0, atol=1e-6)
        unpatch = CosmosUnpatcher3d(4, method)
        torch.testing.assert_close(_by_strips(unpatch, whole, (0, 3, 4)), unpatch(whole), rtol=0, atol=1e-6)
    for cut in (3, 6):  # haar: odd, the first level's window straddles; 2 mod 4, the second level's
        got = _by_strips(embed, x, (0, cut, 16))
        assert got.shape != whole.shape or (got - whole).abs().max() > 1e-2 * whole.abs().max(), cut


def _refused(vae, match: str) -> None:
    """parallelize_vae raises a PlanError matching `match`; no forward replaced, no state attached."""
    with pytest.raises(dtp.PlanError, match=match):
        parallelize_vae(vae, object())
    assert not any("forward" in m.__dict__ for m in vae.modules())
    assert getattr(vae, "_dtp_vae", None) is None


def test_mochi_conv_striding_across_strips_is_refused():
    """A replicate-padded causal conv with a stride in H other than 1 or its kernel (windows that overlap and skip
    rows: not Mochi's) is refused naming it."""
    vae = tiny_vae("AutoencoderKLMochi")
    vae.decoder.block_in.resnets[0].conv1.conv.stride = (1, 2, 2)
    _refused(vae, r"decoder\.block_in\.resnets\.0\.conv1 \(CogVideoXCausalConv3d\) .*stride \(1, 2, 2\)")


def test_cosmos_circular_padding_and_other_processors_are_refused():
    """Cosmos: a circular spatial padding wraps the image's last row onto its first, another attention processor has
    no strip rule, nor another patch method: each named and refused before anything changes."""
    from diffusers.models.attention_processor import MochiVaeAttnProcessor2_0

    vae = tiny_vae("AutoencoderKLCosmos")
    vae.decoder.conv_in.conv_s.pad_mode = "circular"
    _refused(vae, r"decoder\.conv_in\.conv_s \(CosmosCausalConv3d\) .*pad_mode='circular'")
    vae = tiny_vae("AutoencoderKLCosmos")
    vae.decoder.mid_block.attentions[0].processor = MochiVaeAttnProcessor2_0()
    _refused(vae, r"decoder\.mid_block\.attentions\.0 \(CosmosCausalAttention\) .*MochiVaeAttnProcessor2_0")
    vae = tiny_vae("AutoencoderKLCosmos")
    vae.encoder.patch_embed.patch_method = "db2"
    _refused(vae, r"encoder\.patch_embed \(CosmosPatchEmbed3d\) .*patch_method='db2'")


def test_mochi_framewise_switch_is_refused_at_the_call():
    """`_enable_framewise_decoding` sets every causal conv's pad_mode to "constant" after the split: the strip conv
    raises a ForwardError naming the fix instead of padding as the split was planned."""
    conv = tiny_vae("AutoencoderKLMochi").decoder.block_in.resnets[0].conv1
    conv.pad_mode = "constant"
    with pytest.raises(dtp.ForwardError, match="remove_vae_parallel"):
        mochi.causal_conv_rows(conv, torch.zeros(1, 32, 2, 4, 4), split=None)
