"""`dtp.fit`: will this pipeline fit `gpus` GPUs of `gpu_memory` each, with which mesh, and how fast.

For every candidate (`candidates.py`) and one rank (rank 0; every rank of a candidate holds the same
bytes, give or take a padded head):

    weight_bytes[c]  = this rank's parameter bytes of component c           (`Measurer.phase`)
    phase_bytes[p]   = activation peak of phase p on this rank              (`Measurer.phase`)
                       text: the largest text encoder's; denoise: one transformer call; decode: the VAE's
    peak_bytes       = max over phases p of (sum of weight_bytes of the components resident in p
                                              + phase_bytes[p])
    fits             = peak_bytes <= gpu_memory
    with --cache     the step cache's state on this rank (`cache_state.py`) is added to the denoise and decode
                     phases (it lives until the pipeline call ends); rows gain cache, cache_bytes
    step_seconds     = calls per step and rank x `cost.call_seconds` of the transformer's traced FLOPs (traced on
                       fake CUDA tensors: fp32 ones at the fp32 rate), its weight bytes and its collectives, plus
                       the cfg exchange (`cfg_exchange`), on the hardware preset; calls per step: 2 for two-call
                       CFG pipelines, 1 with cfg = 2; `compile` False (`dtp run` without --compile): the compute
                       x `cost.EAGER_FACTOR` (rows say "compiled": true / false)

Candidates are measured unpadded and unquantized first. A pad=True candidate is measured only where its
unpadded twin is refused (padding only costs where it is not needed), a quantized one only where no
unquantized twin (padded or not) fits (weight-only quantization changes the weights, not the FLOPs: at
these sizes the step is compute-bound, so it buys memory, not time, at some cost in quality). Both also
save most of the traces.

Across nodes (`nodes` x `gpus_per_node`, `inter_node` link): the ranks are laid out as `make_mesh` lays them
(`placement.py`: cfg, ring, Ulysses, tp outermost to innermost; torchrun's consecutive ranks per node), a candidate
whose tp or Ulysses group would span nodes is not offered, and each collective of an axis that crosses nodes costs the
inter-node link (`cost.Network`); rows name those axes (`crosses_nodes`) and carry multi-node torchrun and SLURM srun
commands. `replicas` R: rows of R copies of a world / R mesh beside the single-mesh rows, each with its throughput
per GPU (`steps_per_gpu_second` = R / (step_seconds x world)), ranked by it.

Rows that fit come first, fastest first (then smallest peak); the others follow by peak. With replicas, rows that
fit are ranked by throughput per GPU instead.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, replace

from ..errors import ForwardError, PlanError
from ..policy import check_degree, parse_dtype
from ..runtime.cfg.cost import exchange
from ..runtime.fsdp_unit import check_fsdp_option
from . import cost
from .cache_state import CACHE_PHASES, CacheState
from .candidates import USP, Arrangement, Candidate, arrangement, candidates
from .fsdp import fsdp_row
from .hardware import hardware as find_hardware
from .hardware import inter_node as find_inter_node
from .hardware import parse_memory
from .measure import PHASES, Measurer
from .pipelines import PROMPT_TOKENS, FitPipeline, Shape, fit_pipeline
from .placement import AXIS_ORDER, FSDP, WORLD, Nodes, check_nodes, crossing_axes, grid

DEFAULT_PROMPT = "a photo of a cat"
DEFAULT_INTER_NODE = "400Gb IB"  # `--inter-node` when --nodes > 1 names none
RDZV_PORT = 29500


def fit(
    pipeline: str,
    gpus: int | None = None,
    gpu_memory=None,
    *,
    resolution: int | None = None,
    frames: int | None = None,
    hardware: str | None = None,
    height: int | None = None,
    width: int | None = None,
    batch: int = 1,
    dtype: str = "bf16",
    text_tokens: int = PROMPT_TOKENS,
    only: dict | None = None,
    measurer: Measurer | None = None,
    cache: str | None = None,
    compile: bool = False,
    attention_backend: str | None = None,
    nodes: int = 1,
    gpus_per_node: int | None = None,
    inter_node: str | None = None,
    replicas: int = 1,
    fsdp_unit: bool | int | str = True,
) -> dict:
    """The `dtp fit --json` object: `{"pipeline", "gpus", "gpu_memory_bytes", "hardware", "rows": [...]}`.

    pipeline: a released pipeline name (`flux-pipeline`, ...) or a diffusers pipeline directory (configs only).
    text_tokens: prompt length of the T5 / LLM text encoders and of the transformer's text stream (CLIP: 77).
    only: candidate fields to keep, e.g. `{"cp": 1}` (default: every candidate).
    measurer: a `Measurer` of the same pipeline and dtype from an earlier call; cache: a step cache (`cache_state`);
    compile: rows costed as `dtp run --compile` runs, else eager; attention_backend: recorded, put in the commands;
    gpu_memory: bytes, or "24GiB" / "80GB" (default: the preset's); nodes, gpus_per_node, inter_node: nodes joined by
    a link preset (`hardware.INTER_NODE`; "400Gb IB"); replicas: also rows of R copies of a world / R mesh (`dtp serve
    --replicas R`), by throughput per GPU; fsdp_unit: the fsdp rows' FSDP2 unit (`dtp run --fsdp UNIT`), traced so.
    height / width default to `resolution`, else the usual size (`FitPipeline.usual_size`); frames to the usual clip's
    (81 for `wan-pipeline`). Rows as `estimate` builds them; `rejected`: plans that do not fit the mesh, with why.
    """
    placed = _world(gpus, nodes, gpus_per_node, inter_node, batch, replicas)
    hw, memory = _hardware(hardware, gpu_memory)
    spec = fit_pipeline(pipeline)
    frames = frames or spec.usual_frames
    shape = _shape(spec, batch, resolution, height, width, frames, text_tokens)
    measurer, start = measurer or Measurer(spec, parse_dtype(dtype)), time.perf_counter()
    unit = check_fsdp_option(fsdp_unit)
    run, rows, rejected = RunOptions(compile, attention_backend, placed, fsdp_unit=unit), [], []
    for r in dict.fromkeys((1, replicas)):
        found = candidates(spec, placed.gpus // r, batch, placed, r)
        some, refused = _estimate_all(found, spec, measurer, shape, memory, hw, only, cache, replace(run, replicas=r))
        rows, rejected = rows + some, rejected + refused
    rows = sorted(_drop_needless_padding(rows), key=_by_throughput if replicas > 1 else _best_first)
    setup = dict(hardware=hw.name, dtype=dtype, batch=batch, height=shape.height, width=shape.width, frames=frames)
    return {
        **_world_fields(spec, placed, replicas, memory),
        **setup,
        **run.fields(),
        "rows": rows,
        "rejected": rejected,
        "reason": None if any(r["fits"] for r in rows) else why_none_fits(rows, rejected, memory),  # why none fits
        "seconds": round(time.perf_counter() - start, 1),
    }


def _world(gpus, nodes, gpus_per_node, inter_node, batch: int, replicas: int):
    """The GPUs as placed on nodes (`_nodes`), after checking the degrees, the replicas and the node layout."""
    placed = _nodes(gpus, nodes, gpus_per_node, inter_node)
    gpus = placed.gpus
    _ = [check_degree(value, f"dtp fit: --{name}") for name, value in (("gpus", gpus), ("batch", batch))]
    check_degree(replicas, "dtp fit: --replicas")
    if gpus % replicas:
        raise PlanError(f"dtp fit: --replicas {replicas} does not divide {gpus} GPUs; each replica is a whole mesh.")
    check_nodes(placed, gpus)
    return placed


def _world_fields(spec: FitPipeline, placed, replicas: int, memory: int) -> dict:
    """The answer's fields about the pipeline and the GPUs it is fitted to."""
    return {
        "pipeline": spec.name,
        "title": spec.title,
        "gpus": placed.gpus,
        "nodes": placed.nodes,
        "gpus_per_node": placed.gpus_per_node,
        "inter_node": placed.link.name if placed.link else None,
        "replicas": replicas,
        "guidance_passes": spec.passes,
        "gpu_memory_bytes": memory,
    }


def _shape(spec: FitPipeline, batch, resolution, height, width, frames, text_tokens) -> Shape:
    """The generation's shape: height / width as given, else `resolution`, else the pipeline's usual size."""
    _, usual_height, usual_width = spec.usual_size
    height, width = height or resolution or usual_height, width or resolution or usual_width
    return Shape(batch, height, width, frames or 1, text_tokens)


def _nodes(gpus, nodes: int, gpus_per_node, inter_node) -> Nodes:
    """The GPUs as `Nodes`: `gpus` on one node, or nodes x gpus_per_node (either may be implied by `gpus`)."""
    check_degree(nodes, "dtp fit: --nodes")
    if gpus_per_node is None:
        if gpus is None:
            raise PlanError("dtp fit: give --gpus N, or --nodes N --gpus-per-node G.")
        if gpus % nodes:
            raise PlanError(f"dtp fit: {gpus} GPUs do not split evenly over {nodes} nodes; give --gpus-per-node.")
        gpus_per_node = gpus // nodes
    check_degree(gpus_per_node, "dtp fit: --gpus-per-node")
    if gpus is not None and gpus != nodes * gpus_per_node:
        raise PlanError(
            f"dtp fit: --gpus {gpus} != --nodes {nodes} x --gpus-per-node {gpus_per_node}; give one or the other."
        )
    link = find_inter_node(inter_node or DEFAULT_INTER_NODE) if nodes > 1 or inter_node else None
    return Nodes(nodes, gpus_per_node, link)


def _hardware(name: str | None, gpu_memory):
    """(the preset, bytes per GPU): `gpu_memory` as given, else the named preset's memory."""
    if gpu_memory is None:
        if name is None:
            raise PlanError("dtp fit: give --gpu-memory (e.g. 80GB) or --hardware (its memory is the default).")
        hw = find_hardware(name, 0)
        return hw, hw.memory_bytes
    memory = parse_memory(gpu_memory)
    return find_hardware(name, memory), memory


@dataclass(frozen=True)
class RunOptions:
    """How the rows' commands run the pipeline (not a mesh choice): compiled or eager, the attention backend, the
    nodes they are launched on, the replicas of the mesh."""

    compile: bool = False
    attention_backend: str | None = None
    nodes: Nodes = Nodes()
    replicas: int = 1
    fsdp_unit: bool | int | str = True  # the fsdp rows' unit size, as `fsdp=` takes it (runtime/fsdp_unit.py)

    def fields(self) -> dict:
        return {
            "compiled": self.compile,
            "attention_backend": self.attention_backend or "auto",
            "fsdp_unit": self.fsdp_unit,
        }


def _best_first(row: dict) -> tuple:
    """Rows that fit first, fastest first, then smallest peak; the others by peak."""
    return (not row["fits"], row["step_seconds"] if row["fits"] else 0, row["peak_bytes"])


def _by_throughput(row: dict) -> tuple:
    """Rows that fit first, the most steps per second per GPU first, then fastest; the others by peak."""
    return (not row["fits"], -row["steps_per_gpu_second"] if row["fits"] else 0, *_best_first(row)[1:])


def _estimate_all(found, spec, measurer, shape, memory, hw, only, cache=None, run=RunOptions()):
    """(rows, rejected) of the candidates `found`: unpadded and unquantized first, a padded one only where its
    unpadded twin is refused, a quantized one only where no unquantized twin fits (module docstring)."""
    state = CacheState(cache, measurer, shape, spec.calls_per_step) if cache else None
    rows, rejected = [], []
    runs, fits = set(), set()  # keys of the unpadded candidates that run; of the unquantized ones that fit
    for candidate in sorted(found, key=lambda c: (c.quant is not None, c.pad)):
        options = _options(candidate)
        if only and any(options[k] != v for k, v in only.items()):
            continue
        if (candidate.pad and _key(options) in runs) or (candidate.quant and _key(options, "quant") in fits):
            continue
        try:
            rows.append(estimate(candidate, spec, measurer, shape, memory, hw, state, run))
        # ForwardError: the traced forward refused its input (a sequence length this cp degree does not divide).
        except (PlanError, ForwardError) as exc:
            rejected.append({**options, "reason": str(exc)})
            continue
        runs.add(_key(options))
        if rows[-1]["fits"] and not candidate.quant:
            fits.add(_key(options, "quant"))
    return rows, rejected


def estimate(
    candidate: Candidate,
    spec: FitPipeline,
    measurer: Measurer,
    shape: Shape,
    memory: int,
    hw,
    state=None,
    run: RunOptions = RunOptions(),
):
    """One row: per-rank weights, phase activations (plus a step cache's `state`, a `CacheState`), peak, fit and step
    time of `candidate`, compiled or eager as `run` says."""
    plan = arrangement(candidate, spec, shape.batch)
    figures = {name: measurer.phase(name, setup, shape) for name, setup in plan.setups.items()}
    weights = {name: f.weight_bytes for name, f in figures.items()}
    phase_bytes, cached = _phase_bytes(candidate, spec, plan, figures, state)
    totals = {p: sum(weights[n] for n in weights if p in plan.resident[n]) + phase_bytes[p] for p in PHASES}
    peak_phase = max(PHASES, key=totals.get)
    step = figures[spec.transformer]
    exchange = cfg_exchange(plan, candidate, measurer.output_bytes(plan.setups[spec.transformer], shape))
    layout = grid(candidate.cfg, candidate.cp, candidate.tp, candidate.ulysses, run.replicas)
    crossing = crossing_axes(layout, run.nodes)
    network = cost.Network(frozenset(crossing), run.nodes.link, run.nodes.gpus_per_node or 1)
    call = cost.call_seconds(
        step.flops, weights[spec.transformer], step.collectives, hw, fp32_flops=step.fp32_flops, compiled=run.compile,
        network=network,
    )  # fmt: skip
    seconds = plan.traced_calls * call + cost.collective_seconds(exchange, hw, network)
    world = candidate.world * run.replicas
    row = {
        **_options(candidate),
        "replicas": run.replicas,
        "crosses_nodes": [a for a in crossing if a in AXIS_ORDER or (a == FSDP and candidate.fsdp)],
        "compiled": run.compile,
        "weight_bytes": weights,
        "phase_bytes": phase_bytes,
        "resident_bytes": {p: totals[p] - phase_bytes[p] for p in PHASES},
        "peak_bytes": totals[peak_phase],
        "peak_phase": peak_phase,
        "fits": totals[peak_phase] <= memory,
        "step_seconds": seconds,
        "steps_per_gpu_second": run.replicas / (seconds * world),
        "step_flops": step.flops * plan.traced_calls,
        "step_fp32_flops": step.fp32_flops * plan.traced_calls,
        "attention_kernels": dict(step.attention),
        "traced_on": step.device,
        "step_collective_bytes": sum(r[1] for r in step.collectives) * plan.traced_calls + sum(r[1] for r in exchange),
        "calls_per_step": plan.calls_per_step,
        "traced_calls": plan.traced_calls,
        "command": command(candidate, spec, shape, run=run),
        "serve_command": command(candidate, spec, shape, "serve", run),
        "srun_command": command(candidate, spec, shape, run=run, slurm=True),
        **cached,
    }
    if candidate.fsdp:
        row = fsdp_row(row, candidate, spec, plan, call, measurer.dtype, hw, memory, network, run.fsdp_unit)
        row["steps_per_gpu_second"] = run.replicas / (row["step_seconds"] * world)
    return row


def _phase_bytes(candidate: Candidate, spec: FitPipeline, plan, figures: dict, state) -> tuple[dict, dict]:
    """(activation bytes per phase, with a step cache's states in the phases it lives, the cache's row fields)."""
    extras = spec.extras  # run one after another in their phase: the phase's peak is the largest
    phase_bytes = {
        "text": max((figures[n].peak_bytes for n in [*spec.text_encoders, *_in(extras, "text")]), default=0),
        "denoise": figures[spec.transformer].peak_bytes,
        "decode": max(figures[n].peak_bytes for n in [spec.vae, *_in(extras, "decode")]),
    }
    cached = (
        {} if state is None else {"cache": state.name, "cache_bytes": state.bytes(candidate.cp, plan_rows(plan, spec))}
    )
    phase_bytes = {p: b + (cached.get("cache_bytes", 0) if p in CACHE_PHASES else 0) for p, b in phase_bytes.items()}
    return phase_bytes, cached


def _in(extras: dict[str, str], phase: str) -> list[str]:
    return [name for name, where in extras.items() if where == phase]


def plan_rows(plan: Arrangement, spec: FitPipeline) -> int:
    """The batch rows one rank's transformer runs (cfg's batch path gives each group its share)."""
    return plan.setups[spec.transformer].batch


def cfg_exchange(plan: Arrangement, c: Candidate, output_bytes: int) -> list[tuple]:
    """The cfg axis's collectives of one step on one rank, as (op, result bytes, group size, axis)
    (`runtime.cfg.cost`): batch path, every call of the step is exchanged; passes path, once per step: the outputs of
    every group's passes gathered (P x one pass's output; the pair path's records at P = 2), the agreement flags
    over the whole mesh."""
    if plan.cfg_path is None:
        return []
    if plan.cfg_path == "batch":
        records = exchange("batch", c.cfg, c.cfg * output_bytes, c.world) * plan.calls_per_step
    else:
        records = exchange("pair", c.cfg, c.cfg * plan.calls_per_step * output_bytes, c.world)
    return [(op, n, group, "cfg" if group == c.cfg and op == "all_gather" else WORLD) for op, n, group in records]


def _options(c: Candidate) -> dict:
    return {
        "cfg": c.cfg,
        "cp": c.cp,
        "tp": c.tp,
        "cp_mode": c.cp_mode,
        "ulysses": c.ulysses,
        "ring": c.cp // c.ulysses,
        "pad": c.pad,
        "quant": c.quant,
        "text_encoders": c.text_encoders,
        "parallel_vae": c.parallel_vae,
        "fsdp": c.fsdp,
    }


def _drop_needless_padding(rows: list[dict]) -> list[dict]:
    """pad=True rows whose unpadded twin runs: padding would only cost (a twin is the same row with pad False)."""
    unpadded = {_key(r) for r in rows if not r["pad"]}
    return [r for r in rows if not r["pad"] or _key(r) not in unpadded]


def _key(row: dict, *without: str) -> tuple:
    """The row's options but pad (and `without`): the key its twins share."""
    names = ("cfg", "cp", "tp", "cp_mode", "ulysses", "quant", "text_encoders", "parallel_vae", "fsdp")
    return tuple(row[k] for k in names if k not in without) + (row.get("replicas", 1),)


def command(
    c: Candidate,
    spec: FitPipeline,
    shape: Shape,
    verb: str = "run",
    run: RunOptions = RunOptions(),
    *,
    slurm: bool = False,
) -> str | None:
    """The `dtp run` command line that runs `c` (the VAE split needs no option: `dtp run` splits it when it can);
    with verb "serve", the `dtp serve` line that loads the same mesh (sizes and frames then come per request; with
    replicas, all of them: `--replicas R`). On several nodes, a torchrun line per node (`--nnodes`, `--node-rank
    $NODE_RANK`, `--rdzv-endpoint $MASTER_ADDR:29500`, run on every node); `slurm`: the `srun` line that starts one
    such torchrun per node of an allocation (None on one node)."""
    args = ["--model-dir", spec.model_dir]
    if verb == "run":
        args += ["--prompt", DEFAULT_PROMPT, "--height", str(shape.height), "--width", str(shape.width)]
        if shape.frames > 1:  # a video pipeline: its frame count, and an mp4 (`dtp run` writes by the suffix)
            args += ["--frames", str(shape.frames), "--output", "output.mp4"]
    if c.cfg > 1:
        args += ["--cfg", str(c.cfg)]
    if c.cp_mode == USP:
        args += ["--cp", str(c.cp), "--ulysses", str(c.ulysses)]  # Ulysses inside each of cp / ulysses ring positions
    elif c.cp > 1:
        args += ["--cp", str(c.cp), "--cp-mode", c.cp_mode]
    if c.pad:
        args.append("--pad")
    if c.quant:
        args += ["--quant", c.quant]
    if c.fsdp:
        args += ["--fsdp"] if run.fsdp_unit is True else ["--fsdp", str(run.fsdp_unit)]
    if c.text_encoders == "whole" and c.world > 1:
        args.append("--whole-text-encoders")
    if c.text_encoders == "offloaded":
        args.append("--offload-text-encoders")  # implies whole text encoders
    if run.compile:
        args.append("--compile")
    if run.attention_backend not in (None, "auto"):
        args += ["--attention-backend", run.attention_backend]
    ranks = c.world
    if verb == "serve" and run.replicas > 1:
        args += ["--replicas", str(run.replicas)]
        ranks *= run.replicas
    tail = shlex.join(["-m", "dtp", verb, *args])
    per_node = run.nodes.gpus_per_node or ranks
    if ranks <= per_node:  # one node
        if slurm:
            return None
        return f"python {tail}" if ranks == 1 else f"torchrun --nproc-per-node {ranks} {tail}"
    nnodes = ranks // per_node
    launch = f"torchrun --nnodes {nnodes} --nproc-per-node {per_node}"
    if not slurm:
        return f"{launch} --node-rank $NODE_RANK --rdzv-endpoint $MASTER_ADDR:{RDZV_PORT} {tail}"
    inner = f"{launch} --node-rank \\$SLURM_NODEID --rdzv-endpoint $MASTER_ADDR:{RDZV_PORT} {_in_double_quotes(tail)}"
    head = 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    return f'{head} && srun --nodes {nnodes} --ntasks-per-node 1 --gpus-per-node {per_node} bash -c "{inner}"'


def _in_double_quotes(text: str) -> str:
    """`text` escaped for a bash double-quoted string: taken literally by the shell that runs it."""
    for char in ("\\", '"', "$", "`"):
        text = text.replace(char, "\\" + char)
    return text


def why_none_fits(rows: list[dict], rejected: list[dict], memory: int) -> str:
    """The sentence `dtp fit` prints when no candidate fits."""
    if not rows:
        reasons = "; ".join(sorted({r["reason"] for r in rejected}))[:600]
        return f"no candidate can run: {reasons}"
    best = min(rows, key=lambda r: r["peak_bytes"])
    phase = best["peak_phase"]
    return (
        f"the smallest peak, {best['peak_bytes'] / 1e9:.1f} GB (cp={best['cp']} tp={best['tp']}, text encoders "
        f"{best['text_encoders']}), exceeds {memory / 1e9:.1f} GB by {(best['peak_bytes'] - memory) / 1e9:.1f} GB; "
        f"it is reached in the {phase} phase: {best['resident_bytes'][phase] / 1e9:.1f} GB of weights + "
        f"{best['phase_bytes'][phase] / 1e9:.1f} GB of activations. More GPUs, more memory per GPU, a lower "
        f"resolution would lower it."
    )
