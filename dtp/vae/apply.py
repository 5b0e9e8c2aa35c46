"""`parallelize_vae`: decode and encode of a VAE split along the height over every rank of a mesh.

Data flow of one decode on N ranks (every rank holds the whole VAE; a VAE has no heads to split):

    z (B, C, H, W), the same on every rank
      -> decoder entry: units = split_rows(H, N); rank r keeps latent rows [b_r, b_r+1)
      -> every layer on strips: convs with halo rows (conv.py), GroupNorm with global statistics
         (norm.py), mid-block attention with gathered K/V (attention.py), nearest upsampling as is
      -> decoder exit: all_gather of the strips -> the whole image on every rank (or the strip)

Wan and Qwen-Image split one level up, at `_decode` (video_decode.py): each rank keeps its rows of every
frame chunk, the finished video is gathered once; their decoder's entry then sees the call in flight
(`Split.units` set) and runs on the strip it is given, neither splitting nor gathering.

The encoder is the mirror image: the image's rows are split in multiples of the VAE's downsampling
factor (8 for AutoencoderKL), so every stride-2 convolution has whole strides in each strip.

Parse, check, then mutate: every module of the encoder and decoder is classified first (`_layers`);
an unknown VAE class or layer raises a PlanError naming it, and nothing is installed. The changes are
instance-level `forward` replacements and hooks, undone by `remove_vae_parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..errors import ForwardError, PlanError
from . import hunyuan, ltx, video
from .attention import SequenceGather
from .conv import conv2d_rows, conv3d_rows
from .group import vae_group
from .halo import gather_rows
from .norm import group_norm_rows
from .split import Split
from .strips import bounds, split_rows
from .video_decode import FRAME_LOOP_VAES, check_post_quant_conv, strip_decode

# VAE classes whose encoder and decoder are diffusers' `Encoder` / `Decoder` (vae.py): 2-D convs,
# GroupNorm, one mid-block self-attention, nearest upsampling, stride-2 downsampling. Rows are dim 2.
IMAGE_VAES = ("AutoencoderKL", "AutoencoderKLFlux2")
# Video VAEs (video.py: Wan's causal layers; hunyuan.py; ltx.py): (B, C, T, H, W) activations, rows are dim 3.
VIDEO_VAES = ("AutoencoderKLWan", "AutoencoderKLQwenImage", "AutoencoderKLHunyuanVideo", "AutoencoderKLLTXVideo")
SUPPORTED = IMAGE_VAES + VIDEO_VAES

# Layers that act on each position (row) alone: nothing to exchange.
ROW_LOCAL = (nn.SiLU, nn.ReLU, nn.GELU, nn.Dropout, nn.Identity, nn.Linear)
# Wan 2.2's residual shortcuts (is_residual=True): space-to-depth (AvgDown3D: mean over channel groups of
# f_t x f_s x f_s blocks) and depth-to-space (DupUp3D) by f_s in H. Strip bounds are multiples of f_s at
# every grid (strips.py), so each strip maps to whole rows: row-local.
ROW_LOCAL_NAMES = ("AvgDown3D", "DupUp3D")


@dataclass
class VaeParallel:
    """What `parallelize_vae` installed on one VAE, to run it and to undo it."""

    split: Split
    gather_output: bool
    undo: list = field(default_factory=list)


@dataclass(frozen=True)
class CheckedVae:
    """A VAE whose encoder/decoder layers all have a strip rule: `(path, layer)` per part that needs one."""

    layers: dict


def parallelize_vae(vae: nn.Module, mesh, *, gather_output: bool = True) -> nn.Module:
    """Split `vae`'s decode and encode along the height over every rank of `mesh`, in place; returns `vae`.

    mesh: a DeviceMesh (all its axes are flattened: a VAE has no heads, so every rank takes rows) or
        a ProcessGroup. Each rank computes its own rows of the untiled decode, exactly (fp32: ~1e-7).
    gather_output: True (default): every rank gets the whole image (or latent); False: each rank keeps
        its own rows (rank r's rows of `split_rows(latent height, N)`, scaled), for callers that write strips.
    Raises PlanError, before changing anything, for a VAE class or a layer the split does not know.
    """
    return install_vae(vae, check_vae(vae), mesh, gather_output=gather_output)


def check_vae(vae: nn.Module) -> CheckedVae:
    """Every check of `parallelize_vae`, nothing mutated: PlanError naming the class or the layer."""
    name = type(vae).__name__
    if name not in SUPPORTED:
        raise PlanError(
            f"parallelize_vae: {name} is not supported (supported: {', '.join(SUPPORTED)}); "
            f"leave the VAE whole (dtp.pipeline.WHOLE) or add a rule for its layers in dtp/vae/."
        )
    if getattr(vae, "_dtp_vae", None) is not None:
        raise PlanError(f"parallelize_vae: this {name} is already parallel; call remove_vae_parallel(vae) first.")
    reason = check_post_quant_conv(vae) if name in FRAME_LOOP_VAES else None
    if reason is not None:
        raise PlanError(f"parallelize_vae: {name} runs a {reason}; only a 1 x 1 x 1 one is split at _decode.")
    parts = {part: getattr(vae, part) for part in ("encoder", "decoder") if getattr(vae, part, None) is not None}
    return CheckedVae({part: _layers(module, part) for part, module in parts.items()})


def install_vae(vae: nn.Module, checked: CheckedVae, mesh, *, gather_output: bool = True) -> nn.Module:
    """The mutation half of `parallelize_vae`, for a `check_vae` result of this VAE."""
    state = VaeParallel(Split.over(vae_group(mesh)), gather_output)
    for part, layers in checked.layers.items():
        module = getattr(vae, part)
        for path, layer in layers:
            _install(layer, state, path)
        factor = _height_factor(module)
        dim = 3 if type(vae).__name__ in VIDEO_VAES else 2
        _replace_forward(module, _entry(module.forward, state, factor if part == "encoder" else 1, dim), state)
    if type(vae).__name__ in FRAME_LOOP_VAES:
        _replace_forward(vae, strip_decode(vae, state.split, gather_output), state, name="_decode")
    vae._dtp_vae = state
    return vae


def remove_vae_parallel(vae: nn.Module) -> nn.Module:
    """Undo `parallelize_vae`: every replaced forward and hook removed; the VAE runs whole again."""
    state = getattr(vae, "_dtp_vae", None)
    if state is None:
        return vae
    for undo in reversed(state.undo):
        undo()
    vae._dtp_vae = None
    return vae


def _height_factor(part: nn.Module) -> int:
    """Input rows per latent row of an encoder (1 for a decoder): the product of its downsamplings' H
    strides, times LTX's patchify factor. The encoder's input is split in multiples of it."""
    factor = ltx.patch_factor(part) if type(part).__name__ == "LTXVideoEncoder3d" else 1
    for layer in part.modules():
        factor *= _height_stride(layer)
    return factor


def _height_stride(layer: nn.Module) -> int:
    """The factor by which `layer` divides the height (a downsampling the strips must align to), else 1."""
    from diffusers.models.downsampling import Downsample2D

    if isinstance(layer, Downsample2D):
        return layer.conv.stride[0]
    if video.layer_kind(layer) == "resample" and layer.mode.startswith("downsample"):
        return 2
    return hunyuan.height_stride(layer) * ltx.height_stride(layer)


def _layers(root: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """The layers of `root` that need a strip rule, each checked; PlanError for anything unknown."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.downsampling import Downsample2D
    from diffusers.models.upsampling import Upsample2D

    found, inside = [], set()
    for path, module in root.named_modules():
        full = f"{prefix}.{path}" if path else prefix
        if any(path.startswith(p + ".") for p in inside):
            continue  # handled by its parent's rule
        kind = video.layer_kind(module)
        family = _family(module)
        if kind is not None:
            if _video_layer(module, kind, full):
                found.append((full, module))
            inside |= _owned(module, kind, path)
        elif family is not None:
            rules, kind = family
            reason = rules.check(module, kind)
            if reason is not None:
                name = type(module).__name__
                raise PlanError(f"parallelize_vae: {full} ({name}) has no row-strip rule for {reason}.")
            if rules is hunyuan and kind in ("causal_conv", "mid_block"):
                found.append((full, module))
            inside |= rules.owned(module, kind, path)
        elif type(module).__name__ in ROW_LOCAL_NAMES:
            pass
        elif isinstance(module, Downsample2D):
            _check_downsample(module, full)
            found.append((full, module))
            inside.add(path)
        elif isinstance(module, Attention):
            _check_attention(module, full)
            found.append((full, module))  # its children (group_norm, to_q, ...) get their own rules
        elif isinstance(module, Upsample2D):
            _check_upsample(module, full)  # nearest x2 is row-local; its conv is found as a child
        elif isinstance(module, (nn.Conv2d, nn.Conv3d)):
            _check_conv(module, full)
            found.append((full, module))
        elif isinstance(module, nn.GroupNorm):
            found.append((full, module))
        elif not list(module.children()) and not isinstance(module, ROW_LOCAL):
            raise PlanError(
                f"parallelize_vae: layer {full} ({type(module).__name__}) has no row-strip rule; "
                f"known: Conv2d, Conv3d, GroupNorm, Attention, Upsample2D, Downsample2D, {_names(ROW_LOCAL)}, "
                f"{', '.join(ROW_LOCAL_NAMES)} and the video VAEs' layers (video.py, hunyuan.py, ltx.py)."
            )
    return found


def _family(module: nn.Module):
    """(rules module, kind) for a HunyuanVideo or LTX VAE layer, else None."""
    for rules in (hunyuan, ltx):
        kind = rules.layer_kind(module)
        if kind is not None:
            return rules, kind
    return None


def _video_layer(module: nn.Module, kind: str, path: str) -> bool:
    """Check a causal video VAE layer; True when it needs a strip rule installed."""
    if kind == "rms_norm" and not module.channel_first:
        raise PlanError(
            f"parallelize_vae: {path} normalizes over the last dim; only channel-first RMS_norm is row-local."
        )
    if kind == "resample":
        reason = video.check_resample(module)
        if reason is not None:
            raise PlanError(f"parallelize_vae: {path} ({type(module).__name__}) has no row-strip rule for {reason}.")
        return module.mode.startswith("downsample")
    if kind == "causal_conv" and module.padding_mode != "zeros":
        raise PlanError(f"parallelize_vae: {path} pads with padding_mode={module.padding_mode!r}; only zeros is split.")
    return kind in ("causal_conv", "attention")


def _owned(module: nn.Module, kind: str, path: str) -> set[str]:
    """Paths whose children a video layer's own rule covers: the attention block's; downsampling's pad + conv
    (`resample`; its causal `time_conv` keeps its own rule)."""
    if kind == "attention":
        return {path}
    if kind == "resample" and module.mode.startswith("downsample"):
        return {f"{path}.resample" if path else "resample"}
    return set()


def _names(types) -> str:
    return ", ".join(t.__name__ for t in types)


def _check_conv(conv: nn.Conv2d | nn.Conv3d, path: str) -> None:
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise PlanError(
            f"parallelize_vae: {path} pads with {conv.padding!r} / padding_mode={conv.padding_mode!r}; "
            f"only numeric zero padding is split exactly."
        )


def _check_downsample(down, path: str) -> None:
    if not down.use_conv or down.norm is not None:
        raise PlanError(f"parallelize_vae: {path} (Downsample2D) without a conv or with a norm is not supported.")
    _check_conv(down.conv, path + ".conv")


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


def _install(layer: nn.Module, state: VaeParallel, path: str) -> None:
    from diffusers.models.attention_processor import Attention
    from diffusers.models.downsampling import Downsample2D

    split = state.split
    kind = video.layer_kind(layer)
    if hunyuan.layer_kind(layer) == "causal_conv":
        _replace_forward(layer, lambda x: hunyuan.causal_conv3d_rows(x, layer, split), state)
    elif hunyuan.layer_kind(layer) == "mid_block":
        _replace_forward(layer, lambda x: hunyuan.mid_block_rows(layer, x, split), state)
    elif kind == "causal_conv":
        _replace_forward(layer, lambda x, cache_x=None: video.causal_conv3d_rows(x, layer, split, cache_x), state)
    elif kind == "attention":
        _replace_forward(layer, lambda x: video.attention_block_rows(layer, x, split), state)
    elif kind == "resample":  # downsampling: ZeroPad2d + stride-2 conv as one strip conv
        seq = layer.resample
        _replace_forward(seq, lambda x: video.downsample_rows(x, seq[1], split), state)
    elif isinstance(layer, Downsample2D):
        # Downsample2D pads (0, 1, 0, 1) and convolves with padding 0 when its padding is 0.
        pads = (0, 1) if layer.padding == 0 else None

        def downsample(x, *args, **kwargs):
            return conv2d_rows(x, layer.conv, split, row_pad=pads, width_pad=pads)

        _replace_forward(layer, downsample, state)
    elif isinstance(layer, nn.Conv2d):
        if layer.kernel_size[0] > 1 or layer.stride[0] > 1 or layer.padding[0] > 0:
            _replace_forward(layer, lambda x: conv2d_rows(x, layer, split), state)
    elif isinstance(layer, nn.Conv3d):
        if layer.kernel_size[1] > 1 or layer.stride[1] > 1 or layer.padding[1] > 0:
            _replace_forward(layer, lambda x: conv3d_rows(x, layer, split), state)
    elif isinstance(layer, nn.GroupNorm):
        _replace_forward(layer, lambda x: group_norm_rows(x, layer, split), state)
    elif isinstance(layer, Attention):
        hooks = SequenceGather(split)
        handles = [
            layer.register_forward_pre_hook(hooks.record, with_kwargs=True),
            layer.to_k.register_forward_hook(hooks.gather),
            layer.to_v.register_forward_hook(hooks.gather),
        ]
        state.undo.extend(h.remove for h in handles)
    else:
        raise AssertionError(f"no rule installed for {path}")


def _replace_forward(module: nn.Module, forward, state: VaeParallel, *, name: str = "forward") -> None:
    """`module.<name> = forward` on the instance (the class's method untouched), undone by `state.undo`."""
    assert name not in module.__dict__, f"{type(module).__name__} already has an instance {name}"
    setattr(module, name, forward)
    state.undo.append(lambda: module.__dict__.pop(name, None))


def _entry(forward, state: VaeParallel, factor: int, dim: int):
    """The encoder's / decoder's forward on this rank's rows: split at entry, gathered at exit.

    factor: input rows per latent row (the encoder's downsampling, 1 for the decoder); dim: the rows' dim.
    """
    split = state.split

    def run(sample, *args, **kwargs):
        if split.units is not None:  # inside a strip-level `_decode` (video_decode.py): `sample` is the strip
            return forward(sample, *args, **kwargs)
        height = sample.shape[dim]
        latent_rows, rest = divmod(height, factor)
        if rest or latent_rows < split.world:
            raise ForwardError(
                f"parallel VAE: input height {height} must be a multiple of {factor} with at least "
                f"{split.world} x {factor} rows (one latent row per rank on {split.world} ranks)."
            )
        split.units = split_rows(latent_rows, split.world)
        try:
            b = bounds(split.units)
            mine = sample.narrow(dim, b[split.rank] * factor, split.units[split.rank] * factor)
            out = forward(mine, *args, **kwargs)
            if state.gather_output:
                out = gather_rows(out, dim, split.counts(out.shape[dim]), split.group)
            return out
        finally:
            split.units = None

    return run
