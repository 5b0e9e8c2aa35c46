"""AutoencoderDC (DC-AE: Sana, Sana Sprint, Sana ControlNet, PRX) on row strips: (B, C, H, W), the height split.

Its layers (diffusers `autoencoder_dc.py`) and why each is exact on strips:
- DCDownBlock2d: a 3 x 3 conv (stride 1, then pixel_unshuffle by 2; or stride 2: Sana's), shortcut pixel_unshuffle + a
  mean over channel groups. The conv takes the Conv2d strip rule; pixel_unshuffle maps input rows 2i, 2i + 1 to
  row i, whole rows per strip because every strip bound is even at that grid (`strips.py`). Height stride 2.
- DCUpBlock2d: a 3 x 3 conv then pixel_shuffle by 2 (row i -> rows 2i, 2i + 1), or nearest x2 interpolation then
  the conv (Sana's); shortcut repeat_interleave over channels + pixel_shuffle: row-local around the conv's rule.
- ResBlock / GLUMBConv: 3 x 3 (depthwise) convs (Conv2d rule), 1 x 1 convs, activations, RMSNorm over the channels
  of one position (the LTX channel-norm rule, `ltx.py`: same class, same channel-last use).
- BatchNorm2d (the decoder's upper ResBlocks in DC-AE f32c32-in / mix): with running statistics (eval) a
  per-channel affine map, row-local. In training mode it would normalise by the strip's batch statistics: refused
  when called so.
- SanaMultiscaleLinearAttention: the whole image's token sum all-reduced (`linear_attention.py`).
- Encoder / Decoder shortcuts (channel-group mean, channel repeat) and norm_out: per position.
Strips need at least 2 latent rows wherever a 5 x 5 multiscale projection runs (the halo comes from the neighbours
only): ForwardError from the halo exchange otherwise.
"""

from __future__ import annotations

from torch import nn

from ..errors import ForwardError
from .linear_attention import PROCESSOR, multiscale_attention_rows
from .strip_rule import StripRule, VaeParallel, by_class_name, reason_check


def _check_up(block: nn.Module) -> str | None:
    if block.factor != 2 or (block.interpolate and block.interpolation_mode != "nearest"):
        return f"interpolation {block.interpolation_mode!r} x{block.factor} (only nearest x2 is row-local)"
    return None


def _check_attention(attn: nn.Module) -> str | None:
    processor = type(attn.processor).__name__
    return None if processor == PROCESSOR else f"processor {processor} (the strip rule is {PROCESSOR}'s math)"


def _check_batch_norm(norm: nn.Module) -> str | None:
    if not norm.track_running_stats or norm.running_mean is None:
        return "batch statistics without running statistics (a strip's statistics are not the image's)"
    return None


def _install_attention(attn: nn.Module, state: VaeParallel) -> None:
    state.replace(attn, lambda x: multiscale_attention_rows(attn, x, state.split))


def _install_batch_norm(norm: nn.Module, state: VaeParallel) -> None:
    forward = norm.forward

    def running_stats_only(x):
        if norm.training:
            raise ForwardError(
                "parallel VAE: a BatchNorm2d in training mode normalises by the strip's batch statistics, not the "
                "image's; call vae.eval() (running statistics: exact on strips)."
            )
        return forward(x)

    state.replace(norm, running_stats_only)


# The multiscale attention's children (projections, to_out, norm_out) are still visited and get their own rules.
RULES = (
    StripRule("DCDownBlock2d", by_class_name("DCDownBlock2d"), height_stride=lambda m: m.factor),
    StripRule("DCUpBlock2d", by_class_name("DCUpBlock2d"), reason_check(_check_up)),
    StripRule(
        "SanaMultiscaleLinearAttention",
        by_class_name("SanaMultiscaleLinearAttention"),
        reason_check(_check_attention),
        install=_install_attention,
    ),
    # DC-AE's level without layers (layers_per_block 0) is an empty nn.Sequential: the identity.
    StripRule("empty Sequential", lambda m: isinstance(m, nn.Sequential) and len(m) == 0),
    StripRule(
        "BatchNorm2d",
        lambda m: isinstance(m, nn.BatchNorm2d),
        reason_check(_check_batch_norm),
        install=_install_batch_norm,
    ),
)
