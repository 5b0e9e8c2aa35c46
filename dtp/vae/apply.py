"""`parallelize_vae`: decode and encode of a VAE split along the height over every rank of a mesh.

Data flow of one decode on N ranks (every rank holds the whole VAE; a VAE has no heads to split):

    z (B, C, H, W), the same on every rank
      -> decoder entry: units = split_rows(H, N); rank r keeps latent rows [b_r, b_r+1)
      -> every layer on strips: convs with halo rows (conv.py), GroupNorm with global statistics
         (norm.py), mid-block attention with gathered K/V (attention.py), nearest upsampling as is
      -> decoder exit: all_gather of the strips -> the whole image on every rank (or the strip)

Wan, Qwen-Image, CogVideoX and Magvit split one level up, at `_decode` (video_decode.py): each rank keeps its
rows of every frame chunk, the finished video is gathered once; their decoder's entry then sees the call in flight
(`Split.units` set) and runs on the strip it is given, neither splitting nor gathering.

The encoder is the mirror image: the image's rows are split in multiples of the VAE's downsampling
factor (8 for AutoencoderKL), so every stride-2 convolution has whole strides in each strip.

Parse, check, then mutate: every module of the encoder and decoder is matched against the rule table first
(`rules.checked_layers`); an unknown VAE class or layer raises a PlanError naming it, and nothing is installed.
The changes are instance-level `forward` replacements and hooks, undone by `remove_vae_parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..errors import ForwardError, PlanError
from .group import vae_group
from .halo import gather_rows
from .split import Split
from .strip_rule import VaeParallel
from .strip_rules import DECODE_SPLIT_VAES, SUPPORTED, VAE_CLASSES, VIDEO_VAES, checked_layers, height_factor
from .strips import bounds, split_rows
from .video_decode import check_post_quant_conv, strip_decode

__all__ = [
    "SUPPORTED",
    "VIDEO_VAES",
    "CheckedVae",
    "check_vae",
    "install_vae",
    "parallelize_vae",
    "remove_vae_parallel",
]


@dataclass(frozen=True)
class CheckedVae:
    """A VAE whose encoder/decoder layers all have a strip rule: `[(path, layer, rule)]` per part."""

    layers: dict


def parallelize_vae(vae: nn.Module, mesh, *, gather_output: bool = True) -> nn.Module:
    """Split `vae`'s decode and encode along the height over every rank of `mesh`, in place; returns `vae`.

    mesh: a DeviceMesh (all its axes are flattened: a VAE has no heads, so every rank takes rows) or
        a ProcessGroup. Each rank computes its own rows of the untiled decode, exactly (fp32: ~1e-7).
    gather_output: True (default): every rank gets the whole image (or latent); False: each rank keeps
        its own rows (rank r's rows of `split_rows(latent height, N)`, scaled; CogVideoX's decode: of the
        even partition where its output height divides by N, `recut.py`), for callers that write strips.
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
    reason = check_post_quant_conv(vae) if name in DECODE_SPLIT_VAES else None
    if reason is not None:
        raise PlanError(f"parallelize_vae: {name} runs a {reason}; only a 1 x 1 x 1 one is split at _decode.")
    parts = {part: getattr(vae, part) for part in ("encoder", "decoder") if getattr(vae, part, None) is not None}
    return CheckedVae({part: checked_layers(module, part) for part, module in parts.items()})


def install_vae(vae: nn.Module, checked: CheckedVae, mesh, *, gather_output: bool = True) -> nn.Module:
    """The mutation half of `parallelize_vae`, for a `check_vae` result of this VAE."""
    state = VaeParallel(Split.over(vae_group(mesh)), gather_output)
    vae_class = VAE_CLASSES[type(vae).__name__]
    for part, layers in checked.layers.items():
        module = getattr(vae, part)
        for _, layer, rule in layers:
            if rule.install is not None:
                rule.install(layer, state)
        factor = height_factor(module) if part == "encoder" else 1
        state.replace(module, _entry(module.forward, state, factor, vae_class.row_dim))
    if vae_class.split_at_decode:
        state.replace(vae, strip_decode(vae, state.split, gather_output), name="_decode")
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
        with split.call(split_rows(latent_rows, split.world)):
            b = bounds(split.units)
            mine = sample.narrow(dim, b[split.rank] * factor, split.units[split.rank] * factor)
            out = forward(mine, *args, **kwargs)
            return _gathered(out, split, dim) if state.gather_output else out

    return run


def _gathered(out, split, dim: int):
    """The whole tensor from every rank's strip of `out`; of a (sample, conv cache) pair (CogVideoX's encoder and
    decoder) the sample only: the cache stays this rank's rows, which its next frame batch reads."""
    if isinstance(out, tuple):
        return (_gathered(out[0], split, dim), *out[1:])
    return gather_rows(out, dim, split.counts(out.shape[dim]), split.group)
