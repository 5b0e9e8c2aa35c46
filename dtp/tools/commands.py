"""The argument parsers of every `dtp` subcommand, without importing torch or diffusers.

`dtp --help` and `dtp <command> --help` must answer in well under a second, and torch alone takes
3-4 s to import. So the parsers live here, importing only the standard library, and `cli.main`
imports a command's module (`COMMANDS[name]`, which imports torch) only once that command runs.

The values a parser shows (CP modes, dtype names, released pipelines, defaults) come from
`dtp.choices`, their one torch-free home. `COMMANDS` is the one registry of subcommands: each names
its arguments and its module; adding a command is one entry there and one module in `dtp/tools/`.
"""

from __future__ import annotations

import argparse
import importlib.resources
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..choices import (
    ATTENTION_BACKENDS,
    CACHE_NAMES,
    CHECK_DTYPES,
    COMPILE_BACKENDS,
    CP_MODES,
    DEFAULT_TEXT_TOKENS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TOL,
    DEMO_MODELS,
    DTYPE_NAMES,
    FIT_CACHE_NAMES,
    FIT_TABLE_ROWS,
    HARDWARE_NAMES,
    INTER_NODE_NAMES,
    QUANT_SCHEMES,
    RELEASED_PIPELINES,
    RUN_QUANT_SCHEMES,
)


@dataclass(frozen=True)
class Command:
    """One subcommand: its help, its parser's arguments, and `module()`: the module whose `run(args) -> int` does
    the work, imported only when the command runs (it imports torch; a plain import, so the layer guard sees it)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    module: Callable[[], types.ModuleType]


def bundled_plan_names() -> list[str]:
    """The plans shipped with dtp (`plans/*.yaml`), listed without importing `dtp.plan` (see `dtp.plan.io`)."""
    try:
        folder = importlib.resources.files("dtp.plans")
    except ModuleNotFoundError:  # a source tree that was never installed
        folder = Path(__file__).resolve().parents[2] / "plans"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtp", description="Tensor-parallel sharding plans for diffusion transformers."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", help="on a failure, show the full traceback instead of the one-line message"
    )
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, parents=[common], help=command.help))
    return parser


def _demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=2, help="number of local processes = cfg * TP degree (default 2)")
    p.add_argument(
        "--cfg",
        type=int,
        default=1,
        help="cfg groups: the two guidance branches of each step (true CFG with a negative prompt) on different "
        "groups of nproc / cfg ranks (default 1: no guidance)",
    )
    p.add_argument("--model", choices=DEMO_MODELS, default="flux", help="tiny pipeline to run (default flux)")
    p.add_argument("--plan", default=None, help="bundled plan name or YAML path (default: the one named like --model)")
    p.add_argument("--steps", type=int, default=4, help="denoising steps (default 4)")
    p.add_argument(
        "--size", type=int, default=64, help="image height and width in pixels, a multiple of 4 (default 64)"
    )
    p.add_argument("--seed", type=int, default=0, help="latents seed (default 0)")
    p.add_argument(
        "--pad", action="store_true", help="zero-pad heads and widths tp does not divide (e.g. --nproc 3: 4 heads -> 6)"
    )
    p.add_argument("--output", default="output.png", help="where to save the sharded run's image (default output.png)")


def add_load_options(p: argparse.ArgumentParser) -> None:
    """How a pipeline is loaded and sharded: one set of flags for `dtp run` and `dtp serve`."""
    p.add_argument(
        "--model-dir", required=True, help="a diffusers pipeline folder (model_index.json or modular_model_index.json)"
    )
    p.add_argument(
        "--plan",
        default=None,
        help="bundled plan name or YAML path (default: the model's bundled plan); used under torchrun",
    )
    p.add_argument(
        "--cp", type=int, default=1, help="context-parallel degree under torchrun: tp = world size / cp (default 1)"
    )
    p.add_argument("--cp-mode", choices=CP_MODES, default="ulysses", help="CP attention (default ulysses)")
    add_ulysses(p)
    p.add_argument(
        "--allow-cross-node",
        action="store_true",
        help="accept tp or Ulysses groups that span nodes (default: refused with the axis named, as their traffic "
        "is on every layer's critical path)",
    )
    p.add_argument(
        "--cfg",
        type=int,
        default=1,
        help="cfg groups under torchrun: the guidance branches (or the batch) of each step on different groups of "
        "tp * cp ranks; tp = world size / (cfg * cp) (default 1)",
    )
    p.add_argument("--pad", action="store_true", help="zero-pad heads and widths tp does not divide (exact)")
    _add_kernel_options(p)
    _add_weight_options(p)


def add_ulysses(p: argparse.ArgumentParser) -> None:
    """`--ulysses U` (run, serve, check, fit): the Ulysses degree inside --cp (USP)."""
    p.add_argument(
        "--ulysses",
        type=int,
        default=None,
        metavar="U",
        help="USP: Ulysses all-to-all inside groups of U consecutive cp ranks, ring attention over the cp / U groups "
        "(U divides --cp; heads / tp need only divide U, so cp may exceed the head count). U = cp is --cp-mode "
        "ulysses, U = 1 ring (default: --cp-mode's)",
    )


def _add_kernel_options(p: argparse.ArgumentParser) -> None:
    """How the denoiser runs on the device: compiled or eager, and which attention kernel."""
    p.add_argument(
        "--compile",
        nargs="?",
        const=COMPILE_BACKENDS[0],
        choices=COMPILE_BACKENDS,
        default=None,
        metavar="BACKEND",
        help="regional torch.compile of the transformer's repeated blocks (fullgraph; the first step compiles, the "
        f"next reuse it): the GPU path. BACKEND: {', '.join(COMPILE_BACKENDS)} (default {COMPILE_BACKENDS[0]}; "
        "eager traces without generating code)",
    )
    p.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default=None,
        metavar="NAME",
        help="attention kernel for every attention call, Ulysses and ring included: auto, flash, efficient, cudnn, "
        "math (torch's SDPA kernels), or a diffusers dispatcher backend (e.g. _flash_3_hub, sage; default: the "
        "library's choice)",
    )


def _add_weight_options(p: argparse.ArgumentParser) -> None:
    """Where the weights live and what is added to them (FSDP, text encoders, LoRA, quantization, cache)."""
    p.add_argument(
        "--fsdp",
        nargs="?",
        const=True,
        default=False,
        metavar="UNIT",
        help="also divide every sharded component's weights over the cfg x cp ranks (FSDP2; needs --cp or --cfg > 1); "
        "UNIT: blocks per FSDP2 unit (4) or a byte budget per unit (1GB): fewer units, less host time per call, more "
        "weights gathered at once (default: dtp's units, one per block, big blocks split)",
    )
    p.add_argument(
        "--whole-text-encoders",
        action="store_true",
        help="under torchrun, keep the text encoders whole on every rank (default: sharded by their plans, each "
        "rank reading only its slice)",
    )
    p.add_argument(
        "--offload-text-encoders",
        action="store_true",
        help="move the text encoders (whole, as --whole-text-encoders) to the CPU once the prompts are encoded, "
        "before the first transformer call (what `dtp fit` calls 'offloaded')",
    )
    p.add_argument(
        "--lora",
        action="append",
        default=None,
        metavar="[NAME=]PATH",
        help="a diffusers LoRA file or folder for the transformer, repeatable; NAME (default 'lora') is what a "
        '`dtp serve` request weighs with {"lora": {NAME: weight}}',
    )
    p.add_argument("--lora-scale", type=float, default=1.0, help="every loaded LoRA's adapter weight (default 1.0)")
    p.add_argument(
        "--quant",
        choices=RUN_QUANT_SCHEMES,
        default=None,
        help="quantize the transformer's Linears with torchao while loading (int8 / float8 weight-only, fp8: float8 "
        "weights and activations, CUDA capability >= 8.9 and --dtype bf16); text encoders stay unquantized",
    )
    p.add_argument(
        "--cache",
        choices=CACHE_NAMES,
        default=None,
        help="a diffusers step cache on the transformer, made rank-consistent by dtp (docs/cache.md); refused with "
        "the reason on a mesh axis where it is not exact",
    )
    p.add_argument(
        "--cache-threshold", type=float, default=None, help="the threshold of --cache fbc, mag or sea (default: theirs)"
    )
    p.add_argument(
        "--dtype", choices=["auto", *DTYPE_NAMES], default="auto", help="auto: bfloat16 on accelerators, float32 on CPU"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a collective may wait for the other ranks before the process group fails (default 600); "
        "a rank that waits min(60, timeout / 2) s names the ranks behind it",
    )


def _run(p: argparse.ArgumentParser) -> None:
    add_load_options(p)
    asked = p.add_mutually_exclusive_group(required=True)
    asked.add_argument("--prompt", help="the one generation's prompt")
    asked.add_argument(
        "--prompts",
        metavar="FILE.jsonl",
        help='one generation per line, the model loaded once: {"prompt": ..., "seed", "steps", "size": '
        '"WxH", "frames", "image": PATH, "negative_prompt", "output"}; the flags below are the defaults',
    )
    p.add_argument("--negative-prompt", default=None, help="the guidance's negative prompt (default: the pipeline's)")
    p.add_argument(
        "--true-cfg-scale", type=float, default=None, help="Qwen-Image / FLUX.1 true CFG scale (with --negative-prompt)"
    )
    p.add_argument("--guidance-scale", type=float, default=None, help="the pipeline's guidance_scale (default its own)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the pipeline's)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--frames", type=int, default=None, help="video frames (video pipelines; Wan: 4k + 1)")
    p.add_argument("--fps", type=int, default=16, help="the mp4's frame rate (default 16)")
    p.add_argument("--image", default=None, metavar="PATH", help="the pipeline's input image (I2V, edit, Kontext)")
    p.add_argument(
        "--pipeline-arg",
        action="append",
        default=None,
        metavar="KEY=JSON",
        help="any other keyword of the pipeline's __call__, its value as JSON (e.g. max_sequence_length=64)",
    )
    p.add_argument("--seed", type=int, default=42, help="latents seed, the same on every rank (default 42)")
    p.add_argument(
        "--output",
        default=None,
        help="written by rank 0: .png for an image pipeline, .mp4 for a video one (default output.png / output.mp4)",
    )
    p.add_argument("--report", default=None, help="also write per-rank weight bytes and step times as JSON (rank 0)")
    p.add_argument(
        "--save-pixels", default=None, help="also save the float [0, 1] pixels (every frame of a video) as .npy"
    )


def _serve(p: argparse.ArgumentParser) -> None:
    add_load_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address rank 0 listens on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--queue", type=int, default=64, help="requests waiting beyond the running one (default 64)")
    p.add_argument(
        "--pipeline-arg",
        action="append",
        metavar="KEY=VALUE",
        help="a keyword of the pipeline's __call__ every request gets, its value as JSON (e.g. max_area=1024)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=1,
        help="waiting requests of one shape (size, frames, steps, scales, LoRA weights) run as one pipeline call, "
        "up to this many (default 1: one at a time)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="how long to wait for more requests of the first one's shape before a batch starts (default 0)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="keep video jobs (SQLite) and their mp4s here: a job accepted before a restart runs after it "
        "(default: a temporary folder, lost on exit)",
    )
    p.add_argument(
        "--keep-hours", type=float, default=24.0, help="keep a finished video job this long unless deleted (default 24)"
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=2,
        help="runs of a video job a dying rank interrupted before it is failed with the reason (default 2)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="split the ranks into this many groups, each a full copy of the sharded pipeline (world / R ranks, the "
        "same plan) serving its own batches; rank 0 hands each batch to an idle replica (default 1)",
    )


def _check(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        metavar="MODEL_OR_PLAN",
        help=f"bundled plan ({', '.join(bundled_plan_names())}), plan YAML path, diffusers class name, or a "
        f"released pipeline ({', '.join(RELEASED_PIPELINES)}: every component, its own plan or whole)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--cp", type=int, default=1, help="context-parallel degree (fake world size is cp * tp)")
    p.add_argument(
        "--cfg", type=int, default=1, help="cfg groups: also count the cfg exchange of one denoising step (default 1)"
    )
    p.add_argument(
        "--fsdp",
        nargs="?",
        const=True,
        default=False,
        metavar="UNIT",
        help="weights also divided over the cfg x cp ranks (FSDP2): traced per-rank bytes (needs --cp or --cfg > 1); "
        "UNIT as `dtp run --fsdp UNIT` (blocks or bytes per unit)",
    )
    p.add_argument(
        "--quant", choices=QUANT_SCHEMES, help="quantize every Linear (torchao) before sharding: quantized bytes"
    )
    p.add_argument(
        "--cp-mode",
        choices=CP_MODES,
        default="ulysses",
        help="context-parallel attention whose head constraint applies with --cp > 1 (default ulysses)",
    )
    add_ulysses(p)
    p.add_argument(
        "--pad",
        action="store_true",
        help="zero-pad heads and widths tp does not divide (exact; reports the padding overhead)",
    )
    p.add_argument("--plan", help="plan to use with a class name (default: plan_for the class)")
    p.add_argument(
        "--config",
        help="diffusers config.json (default: the released model's full-size config: the class defaults plus "
        "dtp's released overrides)",
    )
    p.add_argument("--dtype", choices=CHECK_DTYPES, default="bf16", help="parameter dtype (default bf16)")
    _check_forward(p)
    p.add_argument(
        "--whole-text-encoders",
        action="store_true",
        help="with a pipeline: keep the text encoders whole on every rank (as `dtp run --whole-text-encoders`)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _check_forward(p: argparse.ArgumentParser) -> None:
    """`dtp check`'s traced forward: its shape, and the switches that skip it."""
    p.add_argument(
        "--resolution",
        type=int,
        default=None,
        help="square image side in pixels for the forward (default 1024); a video model's height (default: its "
        "usual clip, e.g. Wan 480x832 x 81 frames)",
    )
    p.add_argument("--frames", type=int, default=None, help="video frames for the forward (default: the usual clip's)")
    p.add_argument(
        "--no-peak",
        dest="peak",
        action="store_false",
        help="skip the activation peak of one forward at (cp, tp) and at one rank (fake tensors, the whole model)",
    )
    p.add_argument("--text-tokens", type=int, default=DEFAULT_TEXT_TOKENS, help="prompt length for the forward")
    p.add_argument(
        "--no-forward",
        dest="forward",
        action="store_false",
        help="skip the traced forward that counts the collectives and the peak (memory figures only)",
    )
    p.add_argument(
        "--kernels",
        action="store_true",
        help="trace the forward on fake CUDA tensors: per block, the attention kernel of each call, the matmul "
        "dtypes, the collectives and the host syncs a GPU would run",
    )
    add_attention_backend(p)


def add_attention_backend(p: argparse.ArgumentParser) -> None:
    """`--attention-backend NAME` (dtp check, dtp fit): the attention kernel choice the run would make."""
    p.add_argument(
        "--attention-backend",
        default=None,
        metavar="NAME",
        help=f"attention backend: {', '.join(ATTENTION_BACKENDS)}, or a diffusers dispatcher backend name "
        "(e.g. _native_cudnn) (default auto: torch's choice)",
    )


def _verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="diffusers class name (e.g. Flux2Transformer2DModel)")
    p.add_argument("--plan", help="bundled plan name or YAML path (default: plan_for the class)")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel degree = number of local processes")
    p.add_argument(
        "--config", help="config.json path or an inline JSON object (default: the tiny config of a known class)"
    )
    p.add_argument("--tol", type=float, default=DEFAULT_TOL, help=f"relative tolerance (default {DEFAULT_TOL:g})")
    p.add_argument("--unchecked", action="store_true", help="skip the pair and attention checks (see dtp.verify)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--summary",
        dest="verbose",
        action="store_false",
        help="print the first divergent site, the counts and the verdict (the default)",
    )
    shown.add_argument("--verbose", action="store_true", help="print the per-site table before the verdict")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _suggest(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="diffusers class name (e.g. Flux2Transformer2DModel)")
    p.add_argument(
        "--config", help="config.json path or an inline JSON object (default: the tiny config of a known class)"
    )
    p.add_argument("--tp", type=int, default=2, help="TP degree the suggestion must divide (default 2)")
    p.add_argument("-o", "--output", help="write the plan YAML here (default: print it)")


def _fit(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "pipeline", metavar="PIPELINE", help="released pipeline (flux-pipeline, ...) or a pipeline directory"
    )
    _fit_world(p)
    p.add_argument(
        "--resolution",
        type=int,
        default=None,
        help="square image side in pixels (default: the pipeline's usual size: 1024 for images, 720 x 1280 for "
        "wan-pipeline)",
    )
    p.add_argument("--height", type=int, default=None, help="image height (default: --resolution)")
    p.add_argument("--width", type=int, default=None, help="image width (default: --resolution)")
    p.add_argument("--frames", type=int, default=None, help="video frames (video pipelines)")
    p.add_argument("--batch", type=int, default=1, help="images per prompt (default 1)")
    p.add_argument(
        "--hardware",
        default=None,
        help=f"preset for the step time ({', '.join(HARDWARE_NAMES)}; default: nearest memory)",
    )
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="weights and activations")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="also draw the per-rank memory of each row")
    p.add_argument("--all", action="store_true", help=f"print every row (default: the best {FIT_TABLE_ROWS})")
    p.add_argument(
        "--cache",
        choices=FIT_CACHE_NAMES,
        default=None,
        help="add a step cache's state (dtp run --cache) to the denoise and decode peaks of every row",
    )
    p.add_argument(
        "--fsdp-unit",
        default=True,
        metavar="UNIT",
        help="the fsdp rows' FSDP2 unit size, as `dtp run --fsdp UNIT` takes it: blocks per unit (4) or a byte budget "
        "per unit (1GB) (default: dtp's units)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="cost the rows as `dtp run --compile` runs them (default: eager, x1.46 compute as measured on an H200)",
    )
    add_attention_backend(p)
    add_ulysses(p)


def _fit_world(p: argparse.ArgumentParser) -> None:
    """`dtp fit`'s GPUs: how many, how much memory, over how many nodes joined by which link, in how many replicas."""
    p.add_argument("--gpus", type=int, default=None, help="number of GPUs (ranks) (or --nodes x --gpus-per-node)")
    p.add_argument(
        "--gpu-memory", default=None, help="memory per GPU, e.g. 24GiB, 80GB (default: the --hardware preset's)"
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes the GPUs are spread over (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: --gpus / --nodes)")
    p.add_argument(
        "--inter-node",
        default=None,
        metavar="LINK",
        help=f"the link between nodes: {', '.join(INTER_NODE_NAMES)} (default with --nodes > 1: {INTER_NODE_NAMES[0]})",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="also rank R copies of a GPUs / R mesh (dtp serve --replicas R) by throughput per GPU (default 1)",
    )


def _demo_module():
    from . import demo

    return demo


def _run_module():
    from . import run

    return run


def _serve_module():
    from . import serve

    return serve


def _check_module():
    from . import check

    return check


def _verify_module():
    from . import verify

    return verify


def _suggest_module():
    from . import suggest

    return suggest


def _fit_module():
    from . import fit

    return fit


COMMANDS = {
    "demo": Command(
        "generate with a tiny FLUX pipeline on N processes and on 1; compare the images", _demo, _demo_module
    ),
    "run": Command("generate images or videos with a sharded pipeline (launch with torchrun)", _run, _run_module),
    "serve": Command(
        "serve generations over HTTP from a pipeline loaded once (launch with torchrun)", _serve, _serve_module
    ),
    "check": Command("check a plan at full size on the meta device with a fake process group", _check, _check_module),
    "verify": Command(
        "run a plan sharded on local gloo processes; name the first module that diverges", _verify, _verify_module
    ),
    "suggest": Command(
        "propose a plan for a model from one traced forward of a small instance", _suggest, _suggest_module
    ),
    "fit": Command("will a pipeline fit N GPUs: per-rank peak memory and step time of every mesh", _fit, _fit_module),
}
