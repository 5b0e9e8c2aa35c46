"""The parallel VAE's two tables: which VAE classes split (and how their calls are entered), and which layer
runs how on row strips (`STRIP_RULES`, one tuple per VAE family module, first match wins).

A new VAE family is one module with its `RULES` (see `strip_rule.py`), its tuple here, and its classes in `VAE_CLASSES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..errors import PlanError
from . import (
    cogvideox,
    cosmos,
    dc,
    hunyuan,
    hunyuan15,
    hunyuan_image,
    image,
    ltx,
    ltx2,
    magvit,
    minimax,
    mochi,
    wan_qwen,
)
from .strip_rule import StripRule


@dataclass(frozen=True)
class VaeClass:
    """How a VAE class's encoder / decoder calls are split.

    row_dim: the activations' height dim (2 for (B, C, H, W) images, 3 for (B, C, T, H, W) videos).
    frame_loop: its `_decode` runs the decoder once per latent frame (diffusers' Wan / Qwen-Image loop): the split
        happens at `_decode` (`video_decode.py`), each rank keeping its rows of every chunk.
    batch_loop: its `_decode` runs the decoder once per batch of latent frames (CogVideoX: 2 with a conv cache it
        passes back; Magvit: the first frame, then batches, its caches held by the convolutions): split at `_decode`
        too. Apart from `frame_loop` because `dtp fit` replays only the Wan-style per-frame calls (`REPEATED`).
    """

    row_dim: int = 2
    frame_loop: bool = False
    batch_loop: bool = False

    @property
    def split_at_decode(self) -> bool:
        return self.frame_loop or self.batch_loop


# Image VAEs have diffusers' `Encoder` / `Decoder` (image.py); video VAEs (B, C, T, H, W) activations.
VAE_CLASSES = {
    "AutoencoderKL": VaeClass(),
    "AutoencoderKLFlux2": VaeClass(),
    "AutoencoderKLWan": VaeClass(row_dim=3, frame_loop=True),
    "AutoencoderKLQwenImage": VaeClass(row_dim=3, frame_loop=True),
    "AutoencoderKLHunyuanVideo": VaeClass(row_dim=3),
    "AutoencoderKLLTXVideo": VaeClass(row_dim=3),
    "AutoencoderDC": VaeClass(),  # Sana's DC-AE: its own Encoder / Decoder (dc.py)
    # Their `_decode` runs the decoder once per frame batch: split there, as Wan's, every batch a strip until the end.
    "AutoencoderKLCogVideoX": VaeClass(row_dim=3, batch_loop=True),  # cogvideox.py
    "AutoencoderKLMagvit": VaeClass(row_dim=3, batch_loop=True),  # EasyAnimate's (magvit.py)
    "AutoencoderKLLTX2Video": VaeClass(row_dim=3),
    "AutoencoderKLHunyuanVideo15": VaeClass(row_dim=3),
    "AutoencoderKLQwenImage21": VaeClass(row_dim=3, frame_loop=True),
    "AutoencoderKLMiniMaxH3": VaeClass(row_dim=3),
    "AutoencoderKLHunyuanImage": VaeClass(),
    "AutoencoderKLHunyuanImageRefiner": VaeClass(row_dim=3),
    # Issue 45's: Mochi (mochi.py), Allegro (diffusers decodes / encodes it only tiled: each tile's call is split; its
    # layers are the generic ones, image.py), Cosmos 1 (cosmos.py).
    "AutoencoderKLMochi": VaeClass(row_dim=3),
    "AutoencoderKLAllegro": VaeClass(row_dim=3),
    "AutoencoderKLCosmos": VaeClass(row_dim=3),
}
SUPPORTED = tuple(VAE_CLASSES)
VIDEO_VAES = tuple(name for name, vae in VAE_CLASSES.items() if vae.row_dim == 3)
FRAME_LOOP_VAES = tuple(name for name, vae in VAE_CLASSES.items() if vae.frame_loop)
DECODE_SPLIT_VAES = tuple(name for name, vae in VAE_CLASSES.items() if vae.split_at_decode)

# The family modules' rules before the generic ones: WanCausalConv3d is an nn.Conv3d, LTX's norms are leaves.
# Round 9's families first, matched by class name (MiniMaxH3VideoCausalConv3d is an nn.Conv3d); then the others.
# Mochi's replicate-padded CogVideoXCausalConv3d before CogVideoX's rule, CosmosCausalConv3d (an nn.Conv3d) before
# image.py's.
STRIP_RULES: tuple[StripRule, ...] = (
    mochi.RULES
    + cosmos.RULES
    + ltx2.RULES
    + hunyuan15.RULES
    + minimax.RULES
    + hunyuan_image.RULES
    + wan_qwen.RULES
    + hunyuan.RULES
    + ltx.RULES
    + dc.RULES
    + cogvideox.RULES
    + magvit.RULES
    + image.RULES
)


def rule_for(module: nn.Module) -> StripRule | None:
    """The first rule of the table that matches `module`, else None."""
    return next((rule for rule in STRIP_RULES if rule.matches(module)), None)


def checked_layers(root: nn.Module, prefix: str) -> list[tuple[str, nn.Module, StripRule]]:
    """Every layer of `root` a rule covers, each checked, in traversal order; PlanError for an unknown leaf.

    A layer below a path some rule `owns` is not visited: that rule runs it."""
    found, inside = [], set()
    for path, module in root.named_modules():
        if any(path.startswith(owned + ".") if owned else path for owned in inside):  # "": the root owns all
            continue
        full = f"{prefix}.{path}" if path else prefix
        rule = rule_for(module)
        if rule is None:
            if not list(module.children()):
                raise PlanError(
                    f"parallelize_vae: layer {full} ({type(module).__name__}) has no row-strip rule; known: "
                    f"{', '.join(r.name for r in STRIP_RULES)}, {_names(image.ROW_LOCAL)} (dtp/vae/strip_rules.py)."
                )
            continue  # a container: its children are visited
        rule.check(module, full)
        found.append((full, module, rule))
        inside |= {".".join(filter(None, (path, rel))) for rel in rule.owns(module)}
    return found


def height_factor(part: nn.Module) -> int:
    """Input rows per latent row of an encoder (1 for a decoder): the product of its layers' height strides, times
    LTX's patchify factor. The encoder's input is split in multiples of it."""
    factor = ltx.patch_factor(part) if type(part).__name__ in ltx.PATCHIFY_ENCODERS else 1
    for layer in part.modules():
        rule = rule_for(layer)
        factor *= rule.height_stride(layer) if rule is not None else 1
    return factor


def _names(types) -> str:
    return ", ".join(t.__name__ for t in types)
