"""The candidates `dtp fit` weighs: one option per axis, each axis pluggable in one place (`AXES`).

An `Axis` has
    options(pipeline, gpus)          the values it offers, as `Candidate` field updates
    supported(pipeline, candidate)   None, or why this value cannot run with the rest of the candidate
    apply(candidate, layout)         what the value does to each component's `Setup` and to the phases its
                                     weights are resident in (`Layout`), which is all the estimator reads

and the candidates are the product of every axis's options, minus the unsupported ones. Axes today:

    mesh            (cp, tp) with cp * tp = gpus; cp > 1 in "ulysses" and "ring" modes
    pad             zero-padded heads and widths (only kept where the unpadded candidate is refused)
    text_encoders   "sharded" on the tp axis (by their bundled plans), "whole" on every rank, or
                    "offloaded": whole, on the GPU only while encoding, the transformer arriving after it

How the options of this round plug in (one new `Axis` each, nothing else changes):

    cfg             mesh ("cfg", "cp", "tp"), cfg * cp * tp = gpus: the mesh axis offers cfg in {1, 2} for
                    pipelines that run CFG (`pipeline.calls_per_step == 2`); apply: the transformer's
                    `Setup.batch` is halved (each cfg rank runs its half of the doubled batch) and
                    `calls_per_step` becomes 1 per rank; the text encoders and VAE are unchanged
    parallel VAE    `parallel_vae` True where `dtp.parallelize_vae` exists for the VAE class; apply: a new
                    `Setup.split` field for the VAE = the world size, which `measure.Measurer` passes to
                    `dtp.parallelize_vae` before tracing the decode (the weights stay whole)
    quantization    `quant` in {None, "int8", "fp8"} where torchao is importable; apply: a new
                    `Setup.quant` for the transformer, which `Measurer.weights` counts at 1 byte per
                    quantized Linear weight (scales aside), and `cost.compute_seconds(fp8=True)` for fp8
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import product

from ..policy import CP_MODES
from .measure import PHASES, Setup
from .pipelines import FitPipeline

TEXT_ENCODER_MODES = ("sharded", "whole", "offloaded")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One way to run the pipeline on `gpus` ranks (the JSON row's option fields)."""

    cfg: int = 1
    cp: int = 1
    tp: int = 1
    cp_mode: str | None = None
    pad: bool = False
    quant: str | None = None
    text_encoders: str = "whole"
    parallel_vae: bool = False

    @property
    def world(self) -> int:
        return self.cfg * self.cp * self.tp


@dataclass
class Layout:
    """Per component: the `Setup` it is measured under and the phases its weights occupy the GPU."""

    setups: dict[str, Setup]
    resident: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def start(cls, pipeline: FitPipeline, batch: int) -> Layout:
        names = list(pipeline.classes)
        return cls({n: Setup(batch=batch) for n in names}, {n: set(PHASES) for n in names})

    def update(self, name: str, **changes) -> None:
        self.setups[name] = replace(self.setups[name], **changes)


@dataclass(frozen=True)
class Axis:
    name: str
    options: Callable[[FitPipeline, int], list[dict]]
    supported: Callable[[FitPipeline, Candidate], str | None]
    apply: Callable[[Candidate, FitPipeline, Layout], None]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _mesh_options(pipeline: FitPipeline, gpus: int) -> list[dict]:
    options = []
    for cp in _divisors(gpus):
        modes = CP_MODES if cp > 1 else (None,)
        options += [{"cp": cp, "tp": gpus // cp, "cp_mode": mode} for mode in modes]
    return options


def _apply_mesh(c: Candidate, pipeline: FitPipeline, layout: Layout) -> None:
    layout.update(pipeline.transformer, tp=c.tp, cp=c.cp, cp_mode=c.cp_mode or CP_MODES[0])


def _apply_pad(c: Candidate, pipeline: FitPipeline, layout: Layout) -> None:
    for name, setup in layout.setups.items():
        if setup.tp > 1:
            layout.update(name, pad=c.pad)


def _te_supported(pipeline: FitPipeline, c: Candidate) -> str | None:
    if not pipeline.text_encoders and c.text_encoders != "whole":
        return "the pipeline has no text encoders"
    if c.text_encoders == "sharded" and c.tp == 1:
        return "tp=1: nothing to shard them over (same as whole)"
    return None


def _apply_text_encoders(c: Candidate, pipeline: FitPipeline, layout: Layout) -> None:
    for name in pipeline.text_encoders:
        layout.update(name, tp=c.tp if c.text_encoders == "sharded" else 1, pad=c.pad)
        if c.text_encoders == "offloaded":
            layout.resident[name] = {"text"}
    if c.text_encoders == "offloaded":
        layout.resident[pipeline.transformer].discard("text")


def _always(pipeline: FitPipeline, c: Candidate) -> None:
    return None


AXES = [
    Axis("mesh", _mesh_options, _always, _apply_mesh),
    Axis("text_encoders", lambda p, g: [{"text_encoders": m} for m in TEXT_ENCODER_MODES], _te_supported,
         _apply_text_encoders),
    Axis("pad", lambda p, g: [{"pad": False}, {"pad": True}], _always, _apply_pad),
]  # fmt: skip


def candidates(pipeline: FitPipeline, gpus: int) -> list[Candidate]:
    """Every supported combination of the axes' options for `gpus` ranks."""
    found = []
    for choice in product(*(axis.options(pipeline, gpus) for axis in AXES)):
        candidate = Candidate(**{k: v for option in choice for k, v in option.items()})
        if all(axis.supported(pipeline, candidate) is None for axis in AXES):
            found.append(candidate)
    return found


def layout(candidate: Candidate, pipeline: FitPipeline, batch: int) -> Layout:
    """Each component's setup and resident phases under `candidate` (every axis applied in order)."""
    result = Layout.start(pipeline, batch)
    for axis in AXES:
        axis.apply(candidate, pipeline, result)
    return result
