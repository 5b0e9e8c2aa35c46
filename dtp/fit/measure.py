"""Per-rank figures of one component under one setup, measured at full size without memory, cached.

    phase(component, setup, shape)   the full-size component built on the meta device with each block list
                                     cut to its first element (two for text encoders, see below), sharded by
                                     its plan on rank 0 of a fake world (`fakepg.py`) as
                                     `dtp.parallelize_pipeline` does (context parallelism included), made of
                                     fake cpu tensors and run on fake inputs under `trace.PhaseTrace`; gives
                                     this rank's parameter bytes (outside the blocks + one block x their
                                     number), the activation peak, FLOPs and collectives

The transformer is traced on fake CUDA tensors (`analysis/cuda.py`): its attention takes the kernel a CUDA build
of torch runs and dtp's CUDA branches run (ring blocks: whatever `runtime/cp/ring.py` does on CUDA), so its FLOPs
say which run on tensor cores and which in fp32 (`PhaseFigures.fp32_flops`) and which attention kernels ran
(`attention`). A transformer whose forward cannot run on fake CUDA tensors is traced on cpu instead
(`PhaseFigures.device` says which). Text encoders and VAEs are traced on cpu (memory only; no step time).

Text encoders that return every layer's hidden states keep one activation per layer alive, so their
peak grows with depth: traced at depth 1 and 2, the peak is extrapolated linearly to the full depth
(peak(n) = peak(1) + (n - 1) (peak(2) - peak(1))); a transformer's or a VAE's does not grow, and one
block is traced (`trace.py`).

A `Setup` is hashable and holds only what changes the figures, so candidates that differ elsewhere
(e.g. the transformer's figures do not depend on what happens to the text encoders) share one
measurement: `Measurer` caches by (component, setup, shape), in memory and on disk (`cache.py`).
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial

import torch

from ..analysis.fakepg import fake_mesh
from ..analysis.forward import Call, trace_sharded
from ..analysis.inputs import full_inputs
from ..analysis.trace import Trace, block_weight, scale_blocks, scale_collectives, truncate_blocks
from ..engine import apply
from ..errors import PlanError
from ..pipeline import prepare_component
from ..runtime.mesh import CP_AXIS, RING_AXIS, TP_AXIS, ULYSSES_AXIS, make_mesh, usp_groups
from ..runtime.parallelism import Parallelism
from ..vae import parallelize_vae
from ..vae.video_decode import FRAME_LOOP_VAES
from .cache import FiguresCache, enabled
from .kinds import cut_by_kind
from .pipelines import (
    RELEASED_PIPELINES,
    FitPipeline,
    Shape,
    audio_decode_inputs,
    connector_inputs,
    decode,
    decode_inputs,
    text_inputs,
    vae_scale,
    vae_time_scale,
    vocoder_inputs,
)
from .placement import WORLD

PHASES = ("text", "denoise", "decode")
# Submodules a component calls many times alike, replayed after two runs (`repeats.py`): the per-frame decoder.
REPEATED = dict.fromkeys(FRAME_LOOP_VAES, ("decoder",))

# The fake device the transformer is traced on: "cuda", the kernels a GPU runs (flash attention: no score matrix).
# A test that compares fit with a run on this CPU traces on "cpu", the kernels that run ran.
TRANSFORMER_DEVICE = "cuda"


@dataclass(frozen=True)
class Setup:
    """How one component runs on a rank: what its figures depend on, nothing else."""

    tp: int = 1
    """Degree it is sharded over (1: whole on every rank)."""
    cp: int = 1
    """Context-parallel degree its sequence is split over (the transformer only)."""
    cp_mode: str = "ulysses"
    ulysses: int = 0
    """USP (`dtp.make_mesh(cp=cp, ulysses=U)`, 1 < U < cp): the Ulysses degree inside each ring position; 0: the
    plain `cp_mode` mesh."""
    pad: bool = False
    batch: int = 1
    """Batch this rank runs it on (the cfg axis splits the transformer's over its groups)."""
    split: int = 1
    """Ranks `dtp.parallelize_vae` splits its rows over (the VAE only; 1: whole)."""
    quant: str | None = None
    """`dtp.quant.SCHEMES` name its Linears are quantized with after sharding (`dtp.quantize`), or None."""

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.split


@dataclass(frozen=True)
class PhaseFigures:
    """One component's forward in its phase, on one rank, at full depth."""

    weight_bytes: int
    """This rank's parameter bytes."""
    peak_bytes: int
    flops: int
    collectives: tuple
    """(op, result bytes, group size, mesh axis) per collective; the axis "tp", "ulysses", "ring" (a plain cp mesh:
    its cp_mode's), or "world" for a group that is no axis of the mesh (`_parallelize`)."""
    output_bytes: int = 0
    """Bytes of the call's output on this rank (the transformer's: its latents' shape; what cfg exchanges)."""
    fp32_flops: int = 0
    """The part of `flops` in fp32 matmuls / attention (no tensor cores)."""
    attention: tuple = ()
    """(attention kernel and dtype, calls per call) of the traced forward (`Trace.kernels`), full depth."""
    device: str = "cpu"
    """The fake device it was traced on."""


class Measurer:
    """Builds, shards and traces components of one pipeline in one dtype; every result cached."""

    def __init__(
        self, pipeline: FitPipeline, dtype: torch.dtype, *, cache: bool | None = None, shapes: tuple[Shape, ...] = ()
    ):
        """shapes: every shape the caller will ask for (e.g. both resolutions of a table): each sharded component is
        then traced at all of them at once, built, sharded and quantized once (about half of a trace's cost)."""
        self.pipeline = pipeline
        self.dtype = dtype
        self.shapes = tuple(shapes)
        self._phases: dict = {}
        self._templates: dict = {}
        self._inputs: dict = {}
        # The transformer's latents follow this pipeline's VAE (a directory's may not be its family's released one).
        vae_config = self._template(pipeline.vae, 1)[0].config
        self.vae_scales = vae_scale(vae_config), vae_time_scale(vae_config)
        self._disk = FiguresCache(PhaseFigures) if (enabled() if cache is None else cache) else None

    def phase(self, name: str, setup: Setup, shape: Shape) -> PhaseFigures:
        """The figures of `name`'s forward in its phase at `shape` (PlanError when its plan does not fit); kept in
        memory and on disk (`cache.py`)."""
        shape = self.relevant_shape(name, shape)
        key = (name, setup, shape)
        if key not in self._phases:
            wanted = dict.fromkeys([shape, *(self.relevant_shape(name, s) for s in self.shapes)])
            self._fill(name, setup, [s for s in wanted if (name, setup, s) not in self._phases])
        if isinstance(self._phases[key], Exception):  # PlanError, or ForwardError from the cp hooks
            raise self._phases[key]
        return self._phases[key]

    def _fill(self, name: str, setup: Setup, shapes: list[Shape]) -> None:
        """Figures (or the PlanError that refuses them) of `name` under `setup` at each of `shapes`: from the disk,
        else measured, then written there (refusals are not: the prepare that refuses is quick)."""
        source, kind = self._source(name), self.pipeline.classes[name]
        keys = {s: (source, kind, name, setup, s, str(self.dtype), TRANSFORMER_DEVICE) for s in shapes}
        found = {s: self._disk.get(key) if self._disk else None for s, key in keys.items()}
        missing = [s for s, figures in found.items() if figures is None]
        measured = self._measure_phase(name, setup, missing) if missing else {}
        for s, figures in measured.items():
            if self._disk and not isinstance(figures, Exception):
                self._disk.put(keys[s], figures)
        for s in shapes:
            self._phases[(name, setup, s)] = found[s] if found[s] is not None else measured[s]

    def _source(self, name: str) -> str:
        """What identifies the component's config: the released pipeline's name, or its config.json's text."""
        config = self.pipeline.component_dir(name) / "config.json"
        return (
            self.pipeline.name
            if self.pipeline.name in RELEASED_PIPELINES or not config.is_file()
            else config.read_text()
        )

    def _measure_phase(self, name: str, setup: Setup, shapes: list[Shape]) -> dict:
        """{shape: PhaseFigures, or the PlanError / ForwardError found instead} of `name` under `setup`."""
        try:
            ones = self._trace(name, setup, shapes, 1)
            twos = self._trace(name, setup, shapes, 2) if name.startswith("text_encoder") else None
        except PlanError as exc:  # the plan refuses `setup`: at every shape
            return {s: exc for s in shapes}
        result = {}
        for s in shapes:
            one = ones[0][s]
            if isinstance(one, Exception):
                result[s] = one
            elif twos is None:
                result[s] = _figures(one, ones[1], ones[2], one.peak_bytes, ones[3])
            else:
                result[s] = _figures(one, ones[1], ones[2], _text_peak(one, twos[0][s], ones[2]), ones[3])
        return result

    def _trace(self, name: str, setup: Setup, shapes: list[Shape], depth: int):
        """({shape: trace or PlanError}, parameter bytes by scope, block multiplicities, {process group name: mesh
        axis}) of `name` cut to `depth` blocks per list, built and sharded once and traced at every shape."""
        module, scale = self._template(name, depth)
        module = copy.deepcopy(module)  # sharding mutates it; a meta copy costs next to nothing
        calls = {}
        for s in shapes:
            try:
                calls[s] = self._call(name, module, setup, s)
            except PlanError as exc:  # e.g. an image that is not a whole number of tokens
                calls[s] = exc
        if name == self.pipeline.transformer and TRANSFORMER_DEVICE == "cuda":
            try:  # what a GPU runs (module docstring)
                axes: dict = {}
                shard = partial(_parallelize, name, setup=setup, device="cuda", axes=axes)
                traces, weights = trace_sharded(copy.deepcopy(module), setup.world, shard, calls, quant=setup.quant,
                                                device="cuda")  # fmt: skip
                return traces, weights, scale, axes
            except (RuntimeError, NotImplementedError, TypeError):  # a CUDA path fake tensors cannot take: on cpu
                pass
        axes = {}
        shard = partial(_parallelize, name, setup=setup, axes=axes)
        traces, weights = trace_sharded(module, setup.world, shard, calls, quant=setup.quant)
        return traces, weights, scale, axes

    def output_bytes(self, setup: Setup, shape: Shape) -> int:
        """Bytes of one transformer call's output on a rank running `setup`: its latents' (`hidden_states`) shape."""
        module = self._template(self.pipeline.transformer, 1)[0]
        call = self._call(self.pipeline.transformer, module, setup, self.relevant_shape("transformer", shape))
        latents = call.kwargs["hidden_states"]
        return latents.numel() * latents.element_size()

    def transformer_call(self, shape: Shape):
        """(the transformer on meta cut to one block per kind, the blocks each kept one stands for
        (`kinds.cut_by_kind`), its one-row `Call` at `shape`): what `cache_state` runs to size a step cache's state."""
        name = self.pipeline.transformer
        module, weights = self._template(name, 1)
        return module, weights, self._call(name, module, Setup(), self.relevant_shape(name, shape))

    def _template(self, name: str, depth: int):
        """(component on meta cut to `depth` blocks per list, {list path or kept block's scope: blocks it stands
        for} (`trace.scale_blocks`)), built once. A text encoder keeps its first `depth` layers (`_text_peak`
        extrapolates from depth 1 to 2); the others every kind of block (`kinds.py`: Nucleus-Image's dense and expert
        blocks)."""
        key = (name, depth)
        if key not in self._templates:
            module = self.pipeline.build(name, self.dtype)
            # A VAE's block lists (a vocoder's too) are stages of different widths, not repeats: it is traced whole.
            decoders = (self.pipeline.vae, *(n for n, phase in self.pipeline.extras.items() if phase == "decode"))
            if name in decoders:
                weights = {}
            elif self._is_text(name):
                weights = {path: max(n // depth, 1) for path, n in truncate_blocks(module, keep=depth).items()}
            else:
                weights = cut_by_kind(module)[1]  # depth 1: only the text encoders are traced at depth 2 too
            self._templates[key] = (module, weights)
        return self._templates[key]

    def _is_text(self, name: str) -> bool:
        return name in self.pipeline.text_encoders or self.pipeline.extras.get(name) == "text"

    def relevant_shape(self, name: str, shape: Shape) -> Shape:
        """`shape` with what does not change `name`'s figures set to one value, so that equal measurements share a
        key: the batch (a component runs `Setup.batch`), a text encoder's pixels and frames (it sees the prompt
        only), a VAE's prompt length (it sees the latents only)."""
        shape = replace(shape, batch=1)
        if self._is_text(name):
            return replace(shape, height=0, width=0, frames=1)
        if name == self.pipeline.vae:
            return replace(shape, text_tokens=0)
        if name in self.pipeline.extras:  # the audio decoders: the clip's duration only
            return replace(shape, height=0, width=0, text_tokens=0)
        return shape

    def _call(self, name: str, module, setup: Setup, shape: Shape) -> Call:
        """The `Call` of `name` at `shape` with `setup.batch` rows (meta inputs); the inputs built once per key
        (their builders draw full-size random tensors before moving them to meta: 50 ms for FLUX.2's text states)."""
        key = (name, setup.batch, shape)
        if key not in self._inputs:
            self._inputs[key] = self._build_call(name, module, replace(shape, batch=setup.batch))
        return self._inputs[key]

    def _build_call(self, name: str, module, s: Shape) -> Call:
        if name == self.pipeline.transformer:
            frames = s.frames if self.pipeline.geometry.is_video else None
            sizes = dict(height=s.height, width=s.width, frames=frames, text_tokens=s.text_tokens, batch=s.batch)
            inputs = full_inputs(type(module).__name__, dict(module.config), self.dtype, vae=self.vae_scales, **sizes)
            return Call(inputs.kwargs)
        if name == self.pipeline.vae:
            latents = decode_inputs(module, self.dtype, s, video=self.pipeline.is_video)
            return Call(latents, decode, REPEATED.get(type(module).__name__, ()))
        if name == "connectors":
            return Call(connector_inputs(module, self.dtype, s))
        if name == "audio_vae":
            return Call(audio_decode_inputs(module, self.dtype, s), decode)
        if name == "vocoder":
            return Call(vocoder_inputs(module, self.dtype, s, self._template("audio_vae", 1)[0].config))
        return Call(text_inputs(module, s))


def _parallelize(name: str, module, setup: Setup, device: str = "cpu", axes: dict | None = None) -> None:
    """Shard `module` as the run does on rank 0 of `setup.world` ranks (inside `fake_world`): its plan on the
    ("cp", "tp") mesh (of `device` type; USP's side groups with `setup.ulysses`), or the VAE's rows over
    `setup.split` ranks (`dtp.parallelize_vae`). `axes` gets {process group name: mesh axis} (`mesh_axes`)."""
    if setup.split > 1:
        parallelize_vae(module, make_mesh(tp=setup.split, device_type="cpu"))
        return
    if setup.world == 1:
        return
    mesh = fake_mesh(tp=setup.tp, cp=setup.cp, device=device, ulysses=setup.ulysses or None)
    if axes is not None:
        axes.update(mesh_axes(mesh, setup))
    ready = prepare_component(name, module, Parallelism.build(mesh, cp_mode=setup.cp_mode, pad=setup.pad))
    if ready is not None:
        apply(module, ready)


def mesh_axes(mesh, setup: Setup) -> dict[str, str]:
    """{process group name: axis} of a (cp, tp) mesh: "tp"; the cp axis as "ulysses" or "ring" by `setup.cp_mode`;
    a USP mesh's ring and Ulysses groups (`usp_groups`) by their own names. Collectives on another group (the world's)
    are "world" (`_figures`)."""
    names = {}
    if setup.cp > 1:
        names[mesh[CP_AXIS].get_group().group_name] = ULYSSES_AXIS if setup.cp_mode == "ulysses" else RING_AXIS
    usp = usp_groups(mesh)
    if usp is not None:
        ring, ulysses = usp
        names |= {ring.group_name: RING_AXIS, ulysses.group_name: ULYSSES_AXIS}
    if setup.tp > 1:
        names[mesh[TP_AXIS].get_group().group_name] = TP_AXIS
    return names


def _text_peak(one: Trace, two: Trace, lengths: dict) -> int:
    """A text encoder's peak at full depth from its traces at depth 1 and 2 (module docstring): it keeps one
    activation per layer alive, so peak(n) = peak(1) + (n - 1) (peak(2) - peak(1)), n the depth its call ran."""
    ran = [n for path, n in lengths.items() if f"{path}.0" in one.flops]  # the lists the call ran
    depth = max(ran, default=1)
    return one.peak_bytes + (depth - 1) * max(two.peak_bytes - one.peak_bytes, 0)


def _figures(trace: Trace, weights, scale: dict, peak: int, axes: dict) -> PhaseFigures:
    flops = sum(scale_blocks(trace.flops, scale).values())
    scaled = scale_collectives(trace.collectives, scale)
    records = tuple((r.op, r.bytes, r.group, axes.get(r.group_name, WORLD)) for r in scaled)
    weight_bytes = sum(scale_blocks(weights, scale).values())
    attention = Counter()
    for (scope, kind, kernel), calls in trace.kernels.items():
        if kind == "attention":
            attention[kernel] += calls * block_weight(scope, scale)
    return PhaseFigures(
        weight_bytes=int(weight_bytes),
        peak_bytes=int(peak),
        flops=int(flops),
        collectives=records,
        fp32_flops=int(sum(scale_blocks(trace.fp32_flops, scale).values())),
        attention=tuple(sorted(attention.items())),
        device=trace.device,
    )
