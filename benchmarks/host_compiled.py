"""Host time of one rank's regionally compiled forward against diffusers' model compiled the same way.

    python benchmarks/host_compiled.py                 # FLUX.1 and Wan, tp / cp / cfg; writes results/host_compiled.md
    python benchmarks/host_compiled.py --only "tp=2"   # one mesh (repeatable); prints, writes nothing

Compile is the GPU path (docs/compile.md): in eager a forward's host time is its aten ops (~2-3 µs each), compiled it
is the graph calls, their guards and input handling, and the ops left outside the graphs (dtp's cp splits and
gathers, the cfg wrapper). Per row both models' repeated blocks are compiled by `runtime.compile.compile_blocks`
(inductor, fullgraph), on a fake process group, one pinned core, one torch thread, fp32, no grad; median of
`repeats` alternated calls after 3 (`dtp.testing.host.alternated_medians`, thread CPU time). Column "all guards":
dtp's rank compiled keeping every guard dynamo builds (before `runtime/compile_guards.py`: the DTensor spec guards of
the parameters the blocks read as local tensors, a Python lambda each per call). Each row starts from a reset dynamo
(`torch._dynamo.reset()`): every model of a process shares the blocks' code objects and their cache entries.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).parent))
from host_overhead import MODELS, pin_one_core  # noqa: E402

import dtp.runtime.compile as compile_module  # noqa: E402
from dtp.analysis.fakepg import fake_world  # noqa: E402
from dtp.testing.host import MESHES, alternated_medians, sharded_pair, tiny_inputs  # noqa: E402

RESULT = Path(__file__).parent / "results" / "host_compiled.md"
COMPILED_MESHES = ("tp=2", "cp=2 ulysses", "cp=2 ring", "cfg=2")


def _keep_all(block):
    return lambda entries: [True] * len(entries)


def compiled_ratio(class_name: str, mesh, repeats: int, all_guards: bool) -> tuple[float, float, float]:
    """(diffusers ms, dtp ms, cold compile s) of both models compiled, from a reset dynamo."""
    torch._dynamo.reset()
    patch = mock.patch.object(compile_module, "guard_filter", _keep_all) if all_guards else contextlib.nullcontext()
    with fake_world(mesh.world), patch:
        reference, sharded = sharded_pair(class_name, mesh)
        inputs = tiny_inputs(class_name, mesh)
        start = time.perf_counter()
        compile_module.compile_blocks(reference)
        compile_module.compile_blocks(sharded)
        with torch.no_grad():
            reference(**inputs)
            sharded(**inputs)
        cold = time.perf_counter() - start
        ref_s, dtp_s = alternated_medians(reference, sharded, inputs, repeats=repeats)
    return ref_s * 1e3, dtp_s * 1e3, cold


def row(class_name: str, mesh, repeats: int) -> str:
    ref_ms, dtp_ms, cold = compiled_ratio(class_name, mesh, repeats, all_guards=False)
    ref_all, dtp_all, _ = compiled_ratio(class_name, mesh, repeats, all_guards=True)
    model = class_name.replace("Transformer2DModel", "").replace("Transformer3DModel", "")
    return (
        f"| {model} | {mesh.name} | {ref_ms:.2f} | {dtp_ms:.2f} | {dtp_ms / ref_ms:.2f}x | "
        f"{dtp_all / ref_all:.2f}x | {cold:.0f} |"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--only", action="append", help="a mesh name (e.g. 'tp=2'); prints only")
    args = parser.parse_args(argv)
    core = pin_one_core()
    lines = [
        "| model | mesh | diffusers compiled ms | dtp compiled ms | ratio | all guards | cold compile s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for class_name in MODELS:
        for mesh in MESHES:
            if mesh.name in COMPILED_MESHES and (not args.only or mesh.name in args.only):
                lines.append(row(class_name, mesh, args.repeats))
                print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if not args.only:
        RESULT.write_text(
            "# Host time of one rank's compiled forward vs diffusers' compiled model\n\n"
            f"`python benchmarks/host_compiled.py` (regional compile, inductor, both models; thread CPU time, median "
            f"of {args.repeats} alternated calls after 3, pinned to core {core}, 1 torch thread, fake process group, "
            f"tiny configs, fp32, no grad; torch {torch.__version__}). all guards: dtp's rank compiled with every "
            f"guard dynamo builds (`runtime/compile_guards.py` off), against diffusers' compiled the same way.\n\n"
            f"{text}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
