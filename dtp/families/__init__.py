"""Model families: one module per diffusers DiT class that dtp has a bundled plan for.

Each family module holds everything dtp knows about one architecture besides its plan (`plans/<PLAN>.yaml`):

    CLASS_NAME  the diffusers class
    PLAN        the bundled plan written for it
    TINY        a tiny config with every structural feature (tests, the demo, `dtp lint` / `suggest` / `verify`)
    RELEASED    where the released checkpoint's config differs from the class defaults (full-size checks)
    inputs(cfg, g, batch, img, txt)   forward kwargs for any config: `img` image/video tokens, `txt` text tokens
    GEOMETRY    optional (`geometry.Geometry`; default: an image DiT with an 8x VAE and 2 x 2 latent pixels per
                token): pixels per token, VAE factors in time and space, usual clip, two-call CFG, latent layout

A new family is one module here plus its line in `_MODULES`; nothing else names the class. The released
pipelines that check and fit know by name (`flux-pipeline`, ...) are in `released_pipelines.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import PlanError
from . import (
    allegro,
    anyflow,
    auraflow,
    bria,
    bria_fibo,
    bria_fibo2,
    chroma,
    chronoedit,
    cogvideox,
    cogview3plus,
    cogview4,
    consisid,
    cosmos,
    cosmos3_omni,
    dit,
    easyanimate,
    ernie_image,
    flux,
    flux2,
    flux3,
    glm_image,
    helios,
    hidream,
    hunyuandit,
    hunyuanimage,
    hunyuanvideo,
    hunyuanvideo15,
    hunyuanvideo_framepack,
    ideogram4,
    joyimage_edit,
    joyimage_edit_plus,
    kandinsky5,
    kandinsky6,
    kandinsky6_sr,
    krea2,
    latte,
    longcat_image,
    ltx2,
    ltx_video,
    lumina2,
    minimax_h3,
    mochi,
    motif_video,
    nucleusmoe,
    omnigen,
    ovisimage,
    pixart,
    prx,
    qwenimage,
    qwenimage21,
    sana,
    sana_video,
    sd3,
    skyreels_v2,
    wan,
    wan_animate,
    wan_vace,
    zimage,
)
from .geometry import IMAGE, Geometry

_MODULES = (
    flux,
    flux2,
    qwenimage,
    zimage,
    pixart,
    sd3,
    auraflow,
    cogview4,
    cogvideox,
    chroma,
    hunyuanvideo,
    hunyuanimage,
    lumina2,
    sana,
    wan,
    skyreels_v2,
    ltx_video,
    mochi,
    cosmos,
    hidream,
    qwenimage21,
    # issue 35: the 2026 DiTs
    flux3,
    ovisimage,
    wan_vace,
    hunyuanvideo15,
    ltx2,
    chronoedit,
    longcat_image,
    bria,
    # round 5
    wan_animate,
    sana_video,
    helios,
    cogview3plus,
    hunyuanvideo_framepack,
    consisid,
    latte,
    # round 8: image models
    hunyuandit,
    dit,
    bria_fibo,
    bria_fibo2,
    glm_image,
    krea2,
    ideogram4,
    ernie_image,
    prx,
    # round 8: video models and mixture of experts
    nucleusmoe,
    minimax_h3,
    allegro,
    easyanimate,
    motif_video,
    joyimage_edit,
    joyimage_edit_plus,
    kandinsky5,
    # round 9: the DiTs not attempted before
    kandinsky6,
    kandinsky6_sr,
    cosmos3_omni,
    anyflow,
    # round 10 (issue 45)
    omnigen,
)


@dataclass(frozen=True)
class Family:
    """One architecture: its class, its bundled plan's name, its tiny and released configs, its input builder."""

    class_name: str
    plan: str
    tiny: dict
    released: dict
    inputs: Callable
    geometry: Geometry = IMAGE
    regrid: Callable | None = None
    """Optional `regrid(kwargs, (f, h, w))`: a video family whose other inputs follow the latent grid (Helios'
    history latents and frame indices) resizes them to a full-size grid, after `hidden_states` was replaced."""


def family_of(module) -> Family:
    """The `Family` a family module declares; `GEOMETRY` and `regrid` are optional (the image default)."""
    geometry = getattr(module, "GEOMETRY", IMAGE)
    regrid = getattr(module, "regrid", None)
    return Family(module.CLASS_NAME, module.PLAN, module.TINY, module.RELEASED, module.inputs, geometry, regrid)


FAMILIES: dict[str, Family] = {m.CLASS_NAME: family_of(m) for m in _MODULES}


def family(class_name: str) -> Family:
    """The family of `class_name`; PlanError listing the known ones otherwise."""
    if class_name not in FAMILIES:
        raise PlanError(
            f"no model family for {class_name}; known: {', '.join(sorted(FAMILIES))}. Pass the inputs yourself."
        )
    return FAMILIES[class_name]


# diffusers models that live with their pipeline, not at the package's top level (LTX-2's text connectors, vocoder)
def _ltx2_connectors():
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    return LTX2TextConnectors


def _ltx2_vocoder():
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    return LTX2Vocoder


# Model classes diffusers keeps in a pipeline's package, not at its top level: imported when asked for.
PIPELINE_MODELS = {"LTX2TextConnectors": _ltx2_connectors, "LTX2Vocoder": _ltx2_vocoder}


def model_class(class_name: str):
    """The diffusers class named `class_name`; PlanError when diffusers has none."""
    import diffusers

    cls = getattr(diffusers, class_name, None)
    if cls is None and class_name in PIPELINE_MODELS:
        cls = PIPELINE_MODELS[class_name]()
    if cls is None:
        raise PlanError(f"diffusers has no class named '{class_name}'.")
    return cls


def example_inputs(
    class_name: str, config: dict, *, seed: int = 1, batch: int = 1, img_tokens: int = 16, txt_tokens: int = 8
) -> dict:
    """Keyword arguments for one forward of a `class_name` model built from `config` (same on every rank
    for a fixed seed). PlanError for a class without a family."""
    g = torch.Generator().manual_seed(seed)
    return family(class_name).inputs(config, g, batch, img_tokens, txt_tokens)


def geometry(class_name: str) -> Geometry:
    """The family's `Geometry`, the image default for a class without a family (e.g. a pipeline directory's)."""
    return FAMILIES[class_name].geometry if class_name in FAMILIES else IMAGE


def released_overrides(class_name: str) -> dict:
    """The released checkpoint's config differences from the class defaults ({} for classes without a family)."""
    return dict(FAMILIES[class_name].released) if class_name in FAMILIES else {}
