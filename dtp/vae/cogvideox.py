"""AutoencoderKLCogVideoX (CogVideoX, CogVideoX-Fun, ConsisID) on row strips: (B, C, T, H, W), the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_cogvideox.py`, `downsampling.py`, `upsampling.py`) and why each is exact:
- CogVideoXCausalConv3d (pad_mode "first" / "constant"): time padded with the conv cache or the first frame
  repeated, then CogVideoXSafeConv3d (an nn.Conv3d) with zero padding (0, k_h // 2, k_w // 2): the inner conv takes
  the Conv3d strip rule (halo rows, zeros at the image's edges). The cache it returns is the strip's last frames,
  which the next frame batch's strip needs (every frame batch splits the same latent rows).
- GroupNorm (resnets, the encoder's norm_out, the spatial norms' norm_layer): the whole frame batch's statistics
  (`norm.py`), as the untiled decode normalises each frame batch it is called on.
- CogVideoXSpatialNorm3D: the latent zq (the decoder's input: this rank's latent rows) nearest-interpolated to the
  activation's size, then 1 x 1 x 1 convs: output row o reads zq row floor(o / s) at an s x finer grid (s a power of
  2: the scale H_zq / H_f is exact in floating point). While the strips are the latent's scaled, each strip
  interpolates its own rows; on a re-cut level (below) `latent_rows` takes zq rows [o0 // s, (o1 - 1) // s] for the
  strip's rows [o0, o1) from the ranks that hold them and repeats each s times, so diffusers' interpolation is the
  identity along rows.
- CogVideoXUpsample3D: nearest x2 (time too when compress_time) then a 3 x 3 Conv2d per frame: row-local, then the
  Conv2d strip rule. Its conv's input is re-cut first (`recut.recut_even`): at the first upsampled level whose
  height divides by the ranks the strips become even (60 latent rows on 8 ranks: 120 rows, 15 per rank, instead of
  16 on rank 0), so the largest rank's share of the full-resolution layers, the decode's peak, is 1 / N.
- CogVideoXDownsample3D: time averaged per position (row-local), then F.pad(0, 1, 0, 1) and a
  stride-2 Conv2d with no padding: on a strip the padded bottom row is the image's only on the last rank, so its
  conv drops that row and reads its real bottom rows from the neighbour below (`conv2d_rows`, bottom zero row at
  the image's edge only).
- The encoder's / decoder's (sample, conv cache) output: the parallel entry gathers the sample (`apply._entry`).
Mochi's replicate-padded use of the causal conv has its own rule (`mochi.py`, first in the table). Refused: a causal
conv with a stride in H.
"""

from __future__ import annotations

import torch
from torch import nn

from .conv import conv2d_rows
from .recut import recut_even, take_rows
from .split import Split
from .strip_rule import StripRule, VaeParallel, named_rule

KINDS = {
    "CogVideoXCausalConv3d": "causal_conv",
    "CogVideoXSpatialNorm3D": "spatial_norm",
    "CogVideoXDownsample3D": "downsample",
    "CogVideoXUpsample3D": "upsample",
}


def check(module: nn.Module, kind: str) -> str | None:
    """Why a CogVideoX layer has no strip rule (None when it has one)."""
    if kind == "causal_conv":
        if module.pad_mode == "replicate":
            return "pad_mode='replicate' (the strip rule covers the first-frame / cache padding only)"
        if module.conv.stride[1] != 1:
            return f"stride {module.conv.stride} in H (only time strides)"
    if kind == "downsample" and (module.conv.padding_mode != "zeros" or module.conv.padding != (0, 0)):
        conv = module.conv
        return f"a conv padded {conv.padding} ({conv.padding_mode}) after diffusers' (0, 1, 0, 1) pad (only 0)"
    return None


def _install_downsample(module: nn.Module, state: VaeParallel) -> None:
    conv = module.conv

    def strip_conv(x):
        # x: the (B T, C, h + 1, W + 1) strip diffusers padded; its last row is zeros, the image's bottom only on the
        # last rank: dropped, and the conv's (0, 1) row padding taken over the whole image instead.
        return conv2d_rows(x.narrow(2, 0, x.shape[2] - 1), conv, state.split, row_pad=(0, 1))

    state.replace(conv, strip_conv)


def _install_upsample(module: nn.Module, state: VaeParallel) -> None:
    """Re-cut the upsampled strip (B T, C, 2h, W) before the conv, which keeps its own Conv2d rule."""
    split = state.split
    hook = module.conv.register_forward_pre_hook(lambda conv, args: (recut_even(args[0], 2, split), *args[1:]))
    state.hooks([hook])


def _install_spatial_norm(module: nn.Module, state: VaeParallel) -> None:
    forward = module.forward

    def strip_forward(f, zq, conv_cache=None):
        return forward(f, latent_rows(f, zq, state.split), conv_cache=conv_cache)

    state.replace(module, strip_forward)


def latent_rows(f: torch.Tensor, zq: torch.Tensor, split: Split) -> torch.Tensor:
    """The latent `zq` (B, C, T, h, W) for this rank's rows of `f` (B, C, T', h', W'): zq as is when every rank's
    strip of f is its strip of zq scaled; else zq's rows under f's rows, each repeated s = H_f / H_zq times (nearest
    along rows: f row o reads zq row o // s), one row per row of f."""
    f_bounds, z_bounds = split.bounds(f.shape[3]), split.bounds(zq.shape[3])
    scale, rest = divmod(f_bounds[-1], z_bounds[-1])
    assert rest == 0 and scale & (scale - 1) == 0, (f_bounds, z_bounds)
    if f_bounds == tuple(scale * b for b in z_bounds):  # the same on every rank: all take rows, or none
        return zq
    wanted = [(f_bounds[q] // scale, (f_bounds[q + 1] - 1) // scale + 1) for q in range(split.world)]
    rows = take_rows(zq, 3, z_bounds, wanted, split)
    first, stop = f_bounds[split.rank], f_bounds[split.rank + 1]
    return rows.repeat_interleave(scale, dim=3).narrow(3, first - wanted[split.rank][0] * scale, stop - first)


def _rule(class_name: str, **fields) -> StripRule:
    kind = KINDS[class_name]
    return named_rule(class_name, lambda m: check(m, kind), **fields)


# The causal conv's inner Conv3d, the spatial norm's GroupNorm and convs and the upsampler's Conv2d are visited and
# take their own rules (the spatial norm's forward aligns its latent rows first, the upsampler's conv re-cuts its
# input first); the downsampler runs its conv itself.
RULES = (
    _rule("CogVideoXCausalConv3d"),
    _rule("CogVideoXSpatialNorm3D", install=_install_spatial_norm),
    _rule(
        "CogVideoXDownsample3D",
        install=_install_downsample,
        owns=lambda m: ("",),
        height_stride=lambda m: m.conv.stride[0],
    ),
    _rule("CogVideoXUpsample3D", install=_install_upsample),
)
