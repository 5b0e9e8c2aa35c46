"""`dtp fit`'s modelled times beside every published measurement whose setup dtp can model, with the ratio.

The published figures are the peer survey's (`/work/shared/research/peer-survey.md`, `peer-survey-update.md`), each
with its source. For each, `dtp.fit` is asked for the same pipeline, size, mesh and preset (the nearest one where the
published GPU has none: H800 -> H100 SXM, said in the row) and eager or compiled as published; the
model is the denoising loop only (steps x `step_seconds`), so where a source times the whole generation (text
encoding and VAE decode included) a ratio below 1 is expected. Speed-ups (a mesh against one GPU of the same source)
need no step count and no absolute rate: they test the communication and the per-rank work.

    ratio = modelled / published     (1.00: the model says what was measured; a time < 1 or a speed-up > 1: the model
                                      is optimistic)

What dtp models is dtp's code on that mesh, not the peer's (FA3, fused all-to-alls, their compile): a ratio far from 1
is a difference between the systems as much as an error of the model. Ring rows cost dtp's ring block as it runs on
CUDA today (`dtp check --kernels`).

    PYTHONPATH=. python benchmarks/fit_vs_published.py [--output fit_vs_published.md]
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dtp.fit import fit
from dtp.fit.measure import Measurer
from dtp.fit.pipelines import fit_pipeline

RESULTS = Path(__file__).resolve().parent / "results"
WHOLE = {"quant": None, "text_encoders": "whole", "fsdp": False, "pad": False}


@dataclass(frozen=True)
class Mesh:
    gpus: int
    cfg: int = 1
    cp: int = 1
    tp: int = 1
    cp_mode: str | None = None

    def __str__(self) -> str:
        parts = [f"cfg{self.cfg}"] * (self.cfg > 1) + [f"{self.cp_mode} {self.cp}"] * (self.cp > 1)
        return " ".join(parts + [f"tp{self.tp}"] * (self.tp > 1)) or "1 GPU"


@dataclass(frozen=True)
class Published:
    """One published figure: seconds for `steps` steps (or per step with steps=1), or a speed-up over `base`."""

    source: str
    pipeline: str
    size: tuple  # (height, width, frames or None)
    hardware: str  # the published GPU
    preset: str  # dtp's preset for it
    mesh: Mesh
    compiled: bool
    value: float
    steps: int = 1
    base: Mesh | None = None  # a speed-up of `mesh` over `base` (value = base time / mesh time)
    note: str = ""


ONE = Mesh(1)
FLUX, QWEN, WAN, FLUX2 = "flux-pipeline", "qwenimage-pipeline", "wan-pipeline", "flux2-pipeline"
IMG, IMG2 = (1024, 1024, None), (2048, 2048, None)
WAN720 = (720, 1280, 81)
PUBLISHED = (
    Published("xDiT docs/performance/flux.md", FLUX, IMG, "H100", "H100 SXM", ONE, False, 6.71, 28, note="e2e"),
    Published("xDiT docs/performance/flux.md", FLUX, IMG, "H100", "H100 SXM", ONE, True, 4.30, 28, note="e2e"),
    Published("xDiT docs/performance/flux.md", FLUX, IMG, "4xH100", "H100 SXM", Mesh(4, cp=4, cp_mode="ulysses"),
              False, 4.24, 28, note="e2e"),
    Published("xDiT docs/performance/flux.md", FLUX, IMG, "4xH100", "H100 SXM", Mesh(4, cp=4, cp_mode="ulysses"),
              True, 1.63, 28, note="e2e"),
    Published("xDiT docs/performance/flux.md", FLUX, IMG, "4xH100", "H100 SXM", Mesh(4, cp=4, cp_mode="ulysses"),
              True, 4.30 / 1.63, base=ONE, note="speed-up, compiled"),
    Published("sglang#19673", FLUX, IMG, "H200", "H200", ONE, True, 3.73, 28, note="diffusers backend, FA3"),
    Published("sglang#19673", FLUX, IMG, "2xH200", "H200", Mesh(2, cp=2, cp_mode="ulysses"), True, 2.42, 28,
              note="diffusers backend, FA3"),
    Published("sglang#19673", FLUX, IMG, "2xH200", "H200", Mesh(2, cp=2, cp_mode="ulysses"), True, 3.73 / 2.42,
              base=ONE, note="speed-up"),
    Published("cache-dit NVIDIA_GPU.md", FLUX, IMG, "H100", "H100 SXM", ONE, False, 9.30, 50),
    Published("cache-dit NVIDIA_GPU.md", FLUX, IMG, "2xH100", "H100 SXM", Mesh(2, cp=2, cp_mode="ulysses"), False,
              6.04, 50),
    Published("xDiT / D4 (4xL20)", FLUX, IMG, "4xL20", "L20", Mesh(4, cp=4, cp_mode="ulysses"), False, 0.281,
              note="per step"),
    Published("xDiT / D4 (4xL20)", FLUX, IMG, "4xL20", "L20", Mesh(4, cp=4, cp_mode="ring"), False, 0.351,
              note="per step"),
    Published("cache-dit C2/C3 (L20)", FLUX, IMG, "2xL20", "L20", Mesh(2, tp=2), False, 23.56 / 14.61, base=ONE,
              note="speed-up"),
    Published("cache-dit C2/C3 (L20)", FLUX, IMG, "4xL20", "L20", Mesh(4, tp=4), False, 23.56 / 10.69, base=ONE,
              note="speed-up"),
    Published("cache-dit C2/C3 (L20)", FLUX, IMG, "4xL20", "L20", Mesh(4, cp=4, cp_mode="ulysses"), False,
              23.56 / 8.28, base=ONE, note="speed-up"),
    Published("sglang#16219", FLUX2, IMG, "4xH100", "H100 SXM", Mesh(4, tp=4), False, 10.1, 28, note="denoise"),
    Published("vllm-omni parallelism_acceleration.md", QWEN, IMG2, "4xH800", "H100 SXM",
              Mesh(4, cp=4, cp_mode="ulysses"), False, 112.5 / 39.6, base=ONE, note="speed-up, SDPA"),
    Published("vllm-omni parallelism_acceleration.md", QWEN, IMG, "2xA100", "A100 80GB", Mesh(2, cp=2, cp_mode="ring"),
              False, 45.2 / 29.9, base=ONE, note="speed-up, FA"),
    Published("cache-dit NVIDIA_GPU.md", QWEN, IMG, "2xH100", "H100 SXM", Mesh(2, cp=2, cp_mode="ulysses"), False,
              18.49 / 12.81, base=ONE, note="speed-up"),
    Published("TensorRT-LLM blog 25 (Wan2.2 A14B, 80 f)", WAN, WAN720, "2xB200", "B200", Mesh(2, cfg=2), False,
              342.0 / 180.0, base=ONE, note="speed-up, denoise; Wan 2.1 14B blocks"),
    Published("TensorRT-LLM blog 25 (Wan2.2 A14B, 80 f)", WAN, WAN720, "B200", "B200", ONE, True, 342.0, 40,
              note="denoise, FA4; compiled assumed"),
    Published("TensorRT-LLM blog 25 (Wan2.2 A14B, 80 f)", WAN, WAN720, "2xB200", "B200", Mesh(2, cfg=2), True, 180.0,
              40, note="denoise, FA4; compiled assumed"),
)  # fmt: skip


def step_seconds(measurers: dict, p: Published, mesh: Mesh) -> tuple[float, dict]:
    """(seconds per step, the row) of `mesh` for `p`'s pipeline, size and preset."""
    height, width, frames = p.size
    if p.pipeline not in measurers:
        measurers[p.pipeline] = Measurer(fit_pipeline(p.pipeline), torch.bfloat16)
    only = {**WHOLE, "cfg": mesh.cfg, "cp": mesh.cp, "tp": mesh.tp, "cp_mode": mesh.cp_mode}
    report = fit(p.pipeline, mesh.gpus, "1000GB", height=height, width=width, frames=frames, hardware=p.preset,
                 only=only, measurer=measurers[p.pipeline], compile=p.compiled)  # fmt: skip
    row = report["rows"][0]  # one candidate: the mesh with whole text encoders, unquantized
    return row["step_seconds"], row


def line(measurers: dict, p: Published) -> str:
    seconds, row = step_seconds(measurers, p, p.mesh)
    if p.base is not None:
        modelled = step_seconds(measurers, p, p.base)[0] / seconds
        figure = f"{p.value:.2f}x | {modelled:.2f}x"
    else:
        modelled = seconds * p.steps
        figure = f"{p.value:.3g} s | {modelled:.3g} s"
    mode = "compiled" if p.compiled else "eager"
    kernels = ", ".join(k.split(" ")[0].removeprefix("_scaled_dot_product_") for k in row["attention_kernels"])
    kernels = kernels or "fp32 matmuls"
    steps = f"{p.steps} steps" if p.steps > 1 else ""
    what = ", ".join(x for x in (steps, p.note) if x)
    return (
        f"| {p.source} | {p.pipeline} {p.size[0]}x{p.size[1]}{'x' + str(p.size[2]) if p.size[2] else ''} | "
        f"{p.hardware} ({p.preset}) | {p.mesh} | {mode} | {what} | {figure} | {modelled / p.value:.2f} | {kernels} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(RESULTS / "fit_vs_published.md"))
    args = parser.parse_args()
    start = time.perf_counter()
    measurers: dict = {}
    lines = [
        "# dtp fit against published measurements",
        "",
        "`PYTHONPATH=. python benchmarks/fit_vs_published.py`: the modelled figure (dtp's code on that mesh, "
        "`dtp fit`'s cost model, denoising loop only) beside each published one; ratio = modelled / published "
        "(times: < 1 = the model is faster than the measurement; speed-ups: > 1 = the model expects more speed-up "
        "than was measured). Sources: `research/peer-survey*.md`.",
        "",
        "| source | pipeline | published on (preset) | mesh | mode | what | published | modelled | ratio | "
        "attention (traced) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in PUBLISHED:
        lines.append(line(measurers, p))
        print(lines[-1], flush=True)
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    lines += ["", f"{cpu:.0f} CPU s, {time.perf_counter() - start:.0f} s wall (fit's disk cache as found)."]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
