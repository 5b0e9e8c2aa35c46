"""`dtp fit` for the released pipelines: will they fit 1, 2, 4, 8 GPUs of 24, 48, 80 GB at 1024^2 and 2048^2?

For each pipeline, `dtp.fit` runs once per (GPU count, resolution, memory) with one `Measurer` per process
told both resolutions (each sharded component is built once and traced at both); the memory per GPU only decides
`fits`, so each table row says, for the best candidate of its GPU count, its per-rank peak and which of
24 / 48 / 80 GB it fits, with the fastest candidate that fits each memory size (step time on the preset of that
size: RTX 4090, L40S, H100 SXM). Also writes one plot (FLUX.1-dev at 1024^2 on 2 x 24 GB).

    python benchmarks/fit_table.py [PIPELINE ...] [--jobs 2] [--output fit_table.md]

Cold: the disk cache starts empty (a fresh $DTP_CACHE). The GPU counts are split over `--jobs` processes
(default 2, the two cores of the target machine: 8 and 1 GPUs in one, 4 and 2 in the other, about the same
number of meshes); then the same grid again in one process, every measurement read from the disk cache
(`dtp/fit/cache.py`), which is what a repeated `dtp fit` costs. CPU seconds are the processes' own
(`getrusage`, imports included), measurable on a shared machine where wall time is not; the wall time and the
load average are printed beside them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import tempfile
import time
from pathlib import Path

import torch

from dtp.fit import fit
from dtp.fit.measure import Measurer
from dtp.fit.pipelines import Shape, fit_pipeline
from dtp.fit.report import format_table, label, plot

PIPELINES = ("flux-pipeline", "flux2-pipeline", "qwenimage-pipeline", "wan-pipeline")
RESOLUTIONS = (1024, 2048)
GPUS = (1, 2, 4, 8)
MEMORY = {"24 GB": ("24GB", "RTX 4090"), "48 GB": ("48GB", "L40S"), "80 GB": ("80GB", "H100 SXM")}
RESULTS = Path(__file__).resolve().parent / "results"
PLOTTED = ("flux-pipeline", 1024, 2, "24GB")  # the plot: FLUX.1-dev at 1024^2 on 2 x 24 GB
PLOT = "fit_flux_2x24.png"
GROUPS = ((8, 1), (4, 2))  # GPU counts per process: about the same number of meshes to trace in each


def table(pipeline: str, out, jobs: int) -> tuple[float, float, float]:
    """Markdown rows for one pipeline (the GPU counts split over `jobs` processes); (CPU s of all tasks, of the
    busiest one, wall s): on idle cores the busiest process's CPU seconds bound the wall time."""
    wall = time.perf_counter()
    groups = GROUPS if jobs > 1 else (tuple(g for group in GROUPS for g in group),)
    tasks = [(pipeline, group) for group in groups]
    if jobs > 1:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            results = pool.starmap(_rows, tasks)
    else:
        results = [_rows(*task) for task in tasks]
    lines = {key: line for found, _ in results for key, line in found.items()}
    for key in sorted(lines):
        out(lines[key])
    cpus = [cpu for _, cpu in results]
    return sum(cpus), max(cpus), time.perf_counter() - wall


def _rows(pipeline: str, gpu_counts: tuple[int, ...]) -> tuple[dict, float]:
    """{(resolution, gpus): table row (and the plot where it is drawn)} of one pipeline; its CPU seconds (the
    process's own, imports included). One `Measurer` told both resolutions: each sharded component is traced at
    both at once."""
    start = _cpu()
    spec = fit_pipeline(pipeline)
    frames = spec.usual_frames or 1
    measurer = Measurer(spec, torch.bfloat16, shapes=tuple(Shape(1, r, r, frames) for r in RESOLUTIONS))
    lines = {}
    for gpus in gpu_counts:
        for resolution in RESOLUTIONS:
            cells, rows = [], []
            for memory, preset in MEMORY.values():
                report = fit(pipeline, gpus, memory, resolution=resolution, hardware=preset, measurer=measurer)
                cells.append(_cell(report["rows"][0] if report["rows"] else None))
                rows += report["rows"]  # quantized rows appear only where nothing unquantized fits that memory
            smallest = min(rows, key=lambda r: r["peak_bytes"]) if rows else None
            line = f"| {report['title']} | {resolution}² | {gpus} | {_peak(smallest)} | " + " | ".join(cells) + " |"
            if pipeline == PLOTTED[0] and (resolution, gpus) == PLOTTED[1:3]:
                line += "\n" + _plot(measurer)
            lines[(resolution, gpus)] = line
    return lines, _cpu() - start


def _plot(measurer: Measurer) -> str:
    pipeline, resolution, gpus, memory = PLOTTED
    report = fit(pipeline, gpus, memory, resolution=resolution, measurer=measurer)
    plot(report, str(RESULTS / PLOT))
    command = f"dtp fit {pipeline} --gpus {gpus} --gpu-memory {memory} --plot {PLOT}"
    return f"\n`{command}`:\n\n```text\n{format_table(report, 20)}\n```\n\n![per-rank memory]({PLOT})\n"


def _peak(row: dict | None) -> str:
    return f"{row['peak_bytes'] / 1e9:.1f} ({label(row)}, {row['peak_phase']})" if row else "-"


def _cell(row: dict | None) -> str:
    if row is None or not row["fits"]:
        return "no"
    return f"{label(row)}: {row['peak_bytes'] / 1e9:.1f} GB, {row['step_seconds']:.2f} s/step"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


HEADER = [
    "# dtp fit: released pipelines on 1-8 GPUs of 24 / 48 / 80 GB",
    "",
    "Generated by `python benchmarks/fit_table.py`: bf16, batch 1, eager (`dtp run` without --compile, `dtp fit`'s",
    "default: compute x 1.46), each pipeline's guidance passes per step (FLUX.1 / FLUX.2 one call; Qwen-Image's",
    "true CFG and Wan's CFG two, one per cfg group with cfg=2), 512 prompt tokens, Wan 2.1 with 81 frames, the VAE",
    "split by rows over every GPU, cp meshes as Ulysses, ring or USP (ring x Ulysses). `smallest peak` = the",
    "candidate with",
    "the lowest per-rank peak (GB = 1e9 bytes), and the phase it is reached in; each memory column = the first",
    "row of `dtp fit` (the fastest candidate that fits), with its step time on the preset of that size",
    "(24 GB: RTX 4090, PCIe; 48 GB: L40S, PCIe; 80 GB: H100 SXM, NVLink). 'te' = text encoders (sharded on tp /",
    "whole / offloaded after encoding); int8wo / fp8wo = weight-only quantized transformer (offered where no",
    "unquantized candidate fits).",
    "",
    "| pipeline | image | GPUs | smallest peak GB | 24 GB | 48 GB | 80 GB |",
    "|---|---|---:|---|---|---|---|",
]


def main(pipelines, jobs: int = 2, name: str = "fit_table.md") -> None:
    os.environ["DTP_CACHE"] = tempfile.mkdtemp(prefix="dtp-fit-")  # cold: no measurement from an earlier run
    path = RESULTS / name
    path.write_text("\n".join(HEADER) + "\n")

    def out(line: str) -> None:  # each row lands in the file at once: a long run leaves what it measured
        print(line, flush=True)
        with path.open("a") as f:
            f.write(line + "\n")

    for pipeline in pipelines:
        cpu, busiest, wall = table(pipeline, out, jobs)
        again = table(pipeline, lambda line: None, 1)  # the same grid again: every measurement from the disk cache
        out(
            f"\n{pipeline}: cold {cpu:.0f} CPU s in {jobs} processes (the busiest {busiest:.0f}; {wall:.0f} wall s, "
            f"load {os.getloadavg()[0]:.1f}); again with the disk cache: {again[0]:.1f} CPU s\n"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="*", default=list(PIPELINES))
    parser.add_argument("--jobs", type=int, default=2, help="processes (one resolution each; default 2)")
    parser.add_argument("--output", default="fit_table.md", help="file name under benchmarks/results/")
    args = parser.parse_args()
    main(args.pipelines, args.jobs, args.output)
