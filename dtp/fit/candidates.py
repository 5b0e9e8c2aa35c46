"""The candidates `dtp fit` weighs: one option per axis, each axis pluggable in one place (`AXES`).

An `Axis` has
    options(pipeline, ask)           the values it offers (`ask`: gpus, batch), as `Candidate` field updates
    supported(pipeline, candidate)   None, or why this value cannot run with the rest of the candidate
    apply(candidate, pipeline, arrangement)   what the value does to each component's `Setup`, to the phases
                                     its weights are resident in and to the calls of a step (`Arrangement`),
                                     which is all the estimator reads

and the candidates are the product of every axis's options, minus the unsupported ones. Axes:

    cfg             groups of the mesh ("cfg", "cp", "tp") that share a step's transformer work
                    (`dtp.make_mesh(tp, cp, cfg)`, `dtp.runtime.cfg`), offered where it pays: a batch of
                    B >= cfg rows is split (each group runs ceil(B / cfg) rows of every call), and a pipeline
                    whose step makes P guidance passes (`FitPipeline.guidance`: true CFG 2, LTX-2 with STG and
                    modality guidance 4) at cfg = K dividing P runs P / K passes per step per group, each a call
                    of its own (the K-pass runtime), the others' outputs exchanged once per step.
                    A rank of a cfg group holds and runs what a rank of the (cp, tp) mesh does, so it is
                    measured on that mesh; the exchange (an all-gather of the output) is added to its cost
    mesh            (cp, tp) with cfg * cp * tp = gpus / replicas; cp > 1 split as ring R x Ulysses U (R U = cp):
                    "ulysses" (U = cp), "ring" (U = 1) and "usp" (1 < U < cp, `dtp.make_mesh(cp=C, ulysses=U)`);
                    on several nodes a tp or Ulysses group that would span nodes is refused
                    (`placement.check_within_nodes`, the rule of `runtime/nodes.py`)
    pad             zero-padded heads and widths (only kept where the unpadded candidate is refused)
    quant           None or a `dtp.quant.SCHEMES` name ("int8wo", "fp8wo"): the transformer's Linears
                    quantized after sharding (`dtp.quantize`), its weights traced as data + scales and its
                    forward with the quantized matmuls
    text_encoders   "sharded" on the tp axis (by their bundled plans), "whole" on every rank, or
                    "offloaded": whole, moved to the CPU once the prompts are encoded (`dtp run
                    --offload-text-encoders`), so they are resident in the text phase only
    fsdp            True: every weight of the transformer (and of sharded text encoders) also divided over the
                    cfg x cp ranks by FSDP2 (`dtp run --fsdp`); its cost is modelled on the row measured without
                    it (`fit/fsdp.py`: gathered bytes per step, prefetch overlap, two whole blocks in the peak)
    parallel_vae    True where `dtp run` splits the VAE (`dtp.parallelize_vae`: a supported class and more
                    than one rank): its decode traced with its rows split over every rank; else whole
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import product

from ..errors import PlanError
from ..policy import CP_MODES
from ..quant import SCHEMES
from ..vae import SUPPORTED as SPLIT_VAES
from .fsdp import fsdp_supported
from .measure import PHASES, Setup
from .pipelines import FitPipeline
from .placement import Nodes, check_within_nodes, grid

TEXT_ENCODER_MODES = ("sharded", "whole", "offloaded")
# The weight-only schemes: float8 dynamic activation ("fp8") holds the same weight bytes as "fp8wo" and runs only
# on CUDA GPUs of capability >= 8.9, so the fake-tensor trace cannot run its matmuls; its memory is the fp8wo row's.
QUANT_SCHEMES = tuple(sorted(s for s in SCHEMES if s.endswith("wo")))
USP = "usp"  # a candidate's cp_mode when cp is ring x Ulysses (1 < ulysses < cp)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One way to run the pipeline on `gpus` ranks (the JSON row's option fields)."""

    cfg: int = 1
    cp: int = 1
    tp: int = 1
    cp_mode: str | None = None
    """"ulysses", "ring", "usp" (Ulysses inside ring positions), None without cp."""
    ulysses: int = 1
    """The Ulysses degree U of cp (cp for "ulysses", 1 for "ring", 1 < U < cp for "usp"); ring degree cp / U."""
    pad: bool = False
    quant: str | None = None
    text_encoders: str = "whole"
    parallel_vae: bool = False
    fsdp: bool = False

    @property
    def world(self) -> int:
        return self.cfg * self.cp * self.tp


@dataclass(frozen=True)
class Ask:
    """What the user asked for that decides which options exist: `gpus` ranks per mesh (the world / replicas), the
    batch, the nodes the `replicas` meshes are laid out on."""

    gpus: int
    batch: int = 1
    nodes: Nodes = Nodes()
    replicas: int = 1


@dataclass
class Arrangement:
    """Per component: the `Setup` it is measured under and the phases its weights occupy the GPU; per step:
    the transformer calls one rank runs and how the cfg axis exchanges their outputs."""

    setups: dict[str, Setup]
    resident: dict[str, set[str]] = field(default_factory=dict)
    calls_per_step: int = 1
    """Transformer calls one rank makes per step."""
    traced_calls: float = 1
    """A step's transformer work in calls of the traced setup (LTX-2 at cfg = 1: calls of 2, 1, 1 rows traced at
    the widest, 2 rows: 4 / 2 = 2)."""
    cfg_path: str | None = None
    """None (cfg = 1), "batch" (each call's rows split over the groups) or "passes" (P / cfg passes each)."""

    @classmethod
    def start(cls, pipeline: FitPipeline, batch: int) -> Arrangement:
        names = list(pipeline.classes)
        setups = {n: Setup(batch=batch) for n in names}
        widest = max(pipeline.guidance)  # the pipeline's widest call (a doubled CFG batch: 2) sets the denoise peak
        setups[pipeline.transformer] = Setup(batch=batch * widest)
        for name, phase in pipeline.extras.items():  # LTX-2's connectors run on the CFG pair's rows
            setups[name] = Setup(batch=batch * widest if phase == "text" else batch)
        calls = len(pipeline.guidance)
        return cls(setups, {n: set(PHASES) for n in names}, calls_per_step=calls, traced_calls=pipeline.passes / widest)

    def update(self, name: str, **changes) -> None:
        self.setups[name] = replace(self.setups[name], **changes)


@dataclass(frozen=True)
class Axis:
    name: str
    options: Callable[[FitPipeline, Ask], list[dict]]
    supported: Callable[[FitPipeline, Candidate], str | None]
    apply: Callable[[Candidate, FitPipeline, Arrangement], None]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _always(pipeline: FitPipeline, c: Candidate) -> None:
    return None


# ---- cfg -------------------------------------------------------------------------------------


def cfg_path(pipeline: FitPipeline, batch: int, cfg: int) -> str | None:
    """How `dtp.runtime.cfg` spreads a step over `cfg` groups: "batch" (a batch of prompts: the rows), "passes"
    (cfg divides the step's guidance passes), or None (it would not help)."""
    if cfg == 1:
        return None
    if batch >= cfg:
        return "batch"
    return "passes" if pipeline.passes > 1 and pipeline.passes % cfg == 0 else None


def _cfg_options(pipeline: FitPipeline, ask: Ask) -> list[dict]:
    return [{"cfg": c} for c in _divisors(ask.gpus) if c == 1 or cfg_path(pipeline, ask.batch, c)]


def _apply_cfg(c: Candidate, pipeline: FitPipeline, arrangement: Arrangement) -> None:
    batch = arrangement.setups[pipeline.transformer].batch // max(pipeline.guidance)  # the prompts' rows
    path = cfg_path(pipeline, batch, c.cfg)
    arrangement.cfg_path = path
    if path == "batch":  # group 0 runs the ceil(B / cfg) first rows of every call
        arrangement.update(pipeline.transformer, batch=-(-batch // c.cfg) * max(pipeline.guidance))
    elif path == "passes":  # each group runs its P / cfg passes, a call of B rows each
        arrangement.update(pipeline.transformer, batch=batch)
        arrangement.calls_per_step = arrangement.traced_calls = pipeline.passes // c.cfg


# ---- mesh, pad ---------------------------------------------------------------------------------


def cp_mode(cp: int, ulysses: int) -> str | None:
    """The mode of a cp axis split as ring (cp / ulysses) x Ulysses (ulysses): None without cp."""
    if cp == 1:
        return None
    return "ulysses" if ulysses == cp else "ring" if ulysses == 1 else USP


def _mesh_options(pipeline: FitPipeline, ask: Ask) -> list[dict]:
    options = []
    for cp in _divisors(ask.gpus):
        splits = _divisors(cp) if cp > 1 else [1]
        for tp in _divisors(ask.gpus // cp):
            options += [{"cp": cp, "tp": tp, "ulysses": u, "cp_mode": cp_mode(cp, u)} for u in splits]
    return options


def _mesh_supported(ask: Ask) -> Callable[[FitPipeline, Candidate], str | None]:
    """A candidate's tp and Ulysses groups inside a node (`placement.check_within_nodes`), as the runtime checks."""

    def supported(pipeline: FitPipeline, c: Candidate) -> str | None:
        try:
            check_within_nodes(grid(c.cfg, c.cp, c.tp, c.ulysses, ask.replicas), ask.nodes)
        except PlanError as exc:
            return str(exc)
        return None

    return supported


def _apply_mesh(c: Candidate, pipeline: FitPipeline, arrangement: Arrangement) -> None:
    # USP runs whatever cp_mode says (`apply_cp`); "ring" prepares it without Ulysses' head check over the whole cp
    mode = {None: CP_MODES[0], USP: "ring"}.get(c.cp_mode, c.cp_mode)
    usp = c.ulysses if c.cp_mode == USP else 0
    arrangement.update(pipeline.transformer, tp=c.tp, cp=c.cp, cp_mode=mode, ulysses=usp)


def _apply_pad(c: Candidate, pipeline: FitPipeline, arrangement: Arrangement) -> None:
    for name, setup in arrangement.setups.items():
        if setup.tp > 1:
            arrangement.update(name, pad=c.pad)


# ---- quantization ------------------------------------------------------------------------------


def _quant_options(pipeline: FitPipeline, ask: Ask) -> list[dict]:
    schemes = QUANT_SCHEMES if importlib.util.find_spec("torchao") is not None else ()
    return [{"quant": q} for q in (None, *schemes)]


def _apply_quant(c: Candidate, pipeline: FitPipeline, arrangement: Arrangement) -> None:
    arrangement.update(pipeline.transformer, quant=c.quant)


# ---- text encoders -----------------------------------------------------------------------------


def _te_supported(pipeline: FitPipeline, c: Candidate) -> str | None:
    if not pipeline.text_encoders and c.text_encoders != "whole":
        return "the pipeline has no text encoders"
    if c.text_encoders == "sharded" and c.tp == 1 and not c.fsdp:  # with fsdp: FSDP2 divides them
        return "tp=1: nothing to shard them over (same as whole)"
    return None


def _apply_text_encoders(c: Candidate, pipeline: FitPipeline, arrangement: Arrangement) -> None:
    for name in pipeline.text_encoders:
        arrangement.update(name, tp=c.tp if c.text_encoders == "sharded" else 1, pad=c.pad)
        if c.text_encoders == "offloaded":
            arrangement.resident[name] = {"text"}


# ---- parallel VAE ------------------------------------------------------------------------------


def splits_vae(pipeline: FitPipeline, world: int) -> bool:
    """Whether `dtp run` on `world` ranks splits this pipeline's VAE by rows (`parallelize_pipeline`)."""
    return world > 1 and pipeline.classes[pipeline.vae] in SPLIT_VAES


def _vae_supported(pipeline: FitPipeline, c: Candidate) -> str | None:
    if c.parallel_vae == splits_vae(pipeline, c.world):
        return None
    if c.parallel_vae:
        return f"one rank or a VAE class dtp.parallelize_vae does not know ({pipeline.classes[pipeline.vae]})"
    return "dtp run splits a supported VAE over every rank"


def _apply_vae(c: Candidate, pipeline: FitPipeline, arrangement: Arrangement) -> None:
    if c.parallel_vae:
        arrangement.update(pipeline.vae, split=c.world)


def axes(ask: Ask = Ask(1)) -> list[Axis]:
    """`AXES` with the mesh's node rule for `ask`'s nodes."""
    return [replace(a, supported=_mesh_supported(ask)) if a.name == "mesh" else a for a in AXES]


AXES = [
    Axis("cfg", _cfg_options, _always, _apply_cfg),
    Axis("mesh", _mesh_options, _always, _apply_mesh),
    Axis("text_encoders", lambda p, a: [{"text_encoders": m} for m in TEXT_ENCODER_MODES], _te_supported,
         _apply_text_encoders),
    Axis("pad", lambda p, a: [{"pad": False}, {"pad": True}], _always, _apply_pad),
    Axis("quant", _quant_options, _always, _apply_quant),
    Axis("parallel_vae", lambda p, a: [{"parallel_vae": True}, {"parallel_vae": False}], _vae_supported, _apply_vae),
    Axis("fsdp", lambda p, a: [{"fsdp": False}, {"fsdp": True}], fsdp_supported, lambda c, p, layout: None),
]  # fmt: skip


def candidates(
    pipeline: FitPipeline, gpus: int, batch: int = 1, nodes: Nodes | None = None, replicas: int = 1
) -> list[Candidate]:
    """Every supported combination of the axes' options for `gpus` ranks per mesh (cfg * cp * tp = gpus), each of
    `replicas` meshes laid out on `nodes` (tp and Ulysses inside a node)."""
    ask = Ask(gpus, batch, nodes or Nodes(), replicas)
    found = []
    chosen = axes(ask)
    for choice in product(*(axis.options(pipeline, ask) for axis in chosen)):
        candidate = Candidate(**{k: v for option in choice for k, v in option.items()})
        if candidate.world == gpus and all(axis.supported(pipeline, candidate) is None for axis in chosen):
            found.append(candidate)
    return found


def arrangement(candidate: Candidate, pipeline: FitPipeline, batch: int) -> Arrangement:
    """Each component's setup and resident phases under `candidate` (every axis applied in order)."""
    result = Arrangement.start(pipeline, batch)
    for axis in AXES:
        axis.apply(candidate, pipeline, result)
    return result
