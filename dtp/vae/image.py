"""The layers of diffusers' `Encoder` / `Decoder` (vae.py: AutoencoderKL, AutoencoderKLFlux2) on row strips, and
the generic torch layers every VAE family shares (LTX's inner Conv3d, the GroupNorms of HunyuanVideo's resnets).

- Conv2d / Conv3d with numeric zero padding: halo rows from the neighbours (`conv.py`); a 1-row kernel with stride
  1 and no row padding is row-local and runs as is.
- GroupNorm: the whole image's statistics (`norm.py`).
- Attention (the mid-block's self-attention, AttnProcessor / AttnProcessor2_0): local queries, K and V gathered
  (`attention.py`), by hooks on to_k / to_v; its children (group_norm, to_q, ...) get their own rules.
- Downsample2D: its (0, 1, 0, 1) pad and stride-2 conv as one strip conv. Upsample2D: nearest x2 is row-local
  (its conv is a child with the Conv2d rule).
- Activations, dropout, Linear: row-local.
"""

from __future__ import annotations

from functools import cache

from torch import nn

from ..errors import PlanError
from .attention import SequenceGather
from .conv import conv2d_rows, conv3d_rows
from .norm import group_norm_rows
from .strip_rule import StripRule, VaeParallel

# Layers that act on each position (row) alone: nothing to exchange.
ROW_LOCAL = (nn.SiLU, nn.ReLU, nn.GELU, nn.Dropout, nn.Identity, nn.Linear)


@cache
def _diffusers_layers() -> dict[str, type]:
    """diffusers' layer classes by name, imported on first use (diffusers is heavy to import)."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.downsampling import Downsample2D
    from diffusers.models.upsampling import Upsample2D

    return {"Attention": Attention, "Downsample2D": Downsample2D, "Upsample2D": Upsample2D}


def _diffusers_layer(name: str):
    """A `matches` for instances of the diffusers layer class `name` (subclasses included, as isinstance says)."""
    return lambda module: isinstance(module, _diffusers_layers()[name])


def check_conv(conv: nn.Conv2d | nn.Conv3d, path: str) -> None:
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise PlanError(
            f"parallelize_vae: {path} pads with {conv.padding!r} / padding_mode={conv.padding_mode!r}; "
            f"only numeric zero padding is split exactly."
        )


def _install_conv2d(conv: nn.Conv2d, state: VaeParallel) -> None:
    if conv.kernel_size[0] > 1 or conv.stride[0] > 1 or conv.padding[0] > 0:
        state.replace(conv, lambda x: conv2d_rows(x, conv, state.split))


def _install_conv3d(conv: nn.Conv3d, state: VaeParallel) -> None:
    if conv.kernel_size[1] > 1 or conv.stride[1] > 1 or conv.padding[1] > 0:
        state.replace(conv, lambda x: conv3d_rows(x, conv, state.split))


def _check_downsample(down, path: str) -> None:
    if not down.use_conv or down.norm is not None:
        raise PlanError(f"parallelize_vae: {path} (Downsample2D) without a conv or with a norm is not supported.")
    check_conv(down.conv, path + ".conv")


def _install_downsample(down, state: VaeParallel) -> None:
    # Downsample2D pads (0, 1, 0, 1) and convolves with padding 0 when its padding is 0.
    pads = (0, 1) if down.padding == 0 else None

    def downsample(x, *args, **kwargs):
        return conv2d_rows(x, down.conv, state.split, row_pad=pads, width_pad=pads)

    state.replace(down, downsample)


def _check_upsample(up, path: str) -> None:
    if up.use_conv_transpose or up.norm is not None or not up.interpolate:
        raise PlanError(
            f"parallelize_vae: {path} (Upsample2D) must interpolate (nearest), without a norm or transposed conv."
        )


def _check_attention(attn, path: str) -> None:
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    processor = type(attn.processor).__name__
    if not isinstance(attn.processor, (AttnProcessor, AttnProcessor2_0)) or attn.spatial_norm is not None:
        raise PlanError(
            f"parallelize_vae: {path} runs {processor} (spatial_norm={attn.spatial_norm is not None}); "
            f"the strip split gathers to_k / to_v of AttnProcessor / AttnProcessor2_0 self-attention only."
        )
    if attn.is_cross_attention or attn.to_k is None or attn.to_v is None:
        raise PlanError(f"parallelize_vae: {path} is not a self-attention with to_k and to_v.")


def _install_attention(attn, state: VaeParallel) -> None:
    gather = SequenceGather(state.split)
    state.hooks(
        [
            attn.register_forward_pre_hook(gather.record, with_kwargs=True),
            attn.to_k.register_forward_hook(gather.gather),
            attn.to_v.register_forward_hook(gather.gather),
        ]
    )


RULES = (
    StripRule(
        "Downsample2D",
        _diffusers_layer("Downsample2D"),
        check=_check_downsample,
        install=_install_downsample,
        owns=lambda m: ("",),
        height_stride=lambda m: m.conv.stride[0],
    ),
    StripRule("Attention", _diffusers_layer("Attention"), _check_attention, install=_install_attention),
    StripRule("Upsample2D", _diffusers_layer("Upsample2D"), _check_upsample),
    StripRule("Conv2d", lambda m: isinstance(m, nn.Conv2d), check_conv, install=_install_conv2d),
    StripRule("Conv3d", lambda m: isinstance(m, nn.Conv3d), check_conv, install=_install_conv3d),
    StripRule(
        "GroupNorm",
        lambda m: isinstance(m, nn.GroupNorm),
        install=lambda norm, state: state.replace(norm, lambda x: group_norm_rows(x, norm, state.split)),
    ),
    StripRule("row-local", lambda m: isinstance(m, ROW_LOCAL)),
)
