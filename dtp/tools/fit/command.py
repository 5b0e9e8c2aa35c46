"""`dtp fit PIPELINE --gpus N --gpu-memory 24GiB`: which meshes fit, per-rank peak memory, step time, commands."""

from __future__ import annotations

import json
import sys

from ...errors import PlanError
from .estimate import fit
from .hardware import HARDWARE
from .report import format_table, plot

TABLE_ROWS = 20


def register(sub) -> None:
    p = sub.add_parser("fit", help="will a pipeline fit N GPUs: per-rank peak memory and step time of every mesh")
    p.add_argument(
        "pipeline", metavar="PIPELINE", help="released pipeline (flux-pipeline, ...) or a pipeline directory"
    )
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs (ranks)")
    p.add_argument("--gpu-memory", required=True, help="memory per GPU, e.g. 24GiB, 80GB")
    p.add_argument("--resolution", type=int, default=1024, help="square image side in pixels (default 1024)")
    p.add_argument("--height", type=int, default=None, help="image height (default: --resolution)")
    p.add_argument("--width", type=int, default=None, help="image width (default: --resolution)")
    p.add_argument("--frames", type=int, default=None, help="video frames (video pipelines)")
    p.add_argument("--batch", type=int, default=1, help="images per prompt (default 1)")
    p.add_argument(
        "--hardware", default=None, help=f"preset for the step time ({', '.join(HARDWARE)}; default: nearest memory)"
    )
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="weights and activations")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="also draw the per-rank memory of each row")
    p.add_argument("--all", action="store_true", help=f"print every row (default: the best {TABLE_ROWS})")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        report = fit(
            args.pipeline,
            args.gpus,
            args.gpu_memory,
            resolution=args.resolution,
            frames=args.frames,
            hardware=args.hardware,
            height=args.height,
            width=args.width,
            batch=args.batch,
            dtype=args.dtype,
        )
    except PlanError as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"dtp fit: {exc}", file=sys.stderr)
        return 1
    if args.plot:
        plot(report, args.plot)
    print(json.dumps(report, indent=1) if args.json else format_table(report, None if args.all else TABLE_ROWS))
    return 0
