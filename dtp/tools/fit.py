"""`dtp fit PIPELINE --gpus N --gpu-memory 24GiB`: which meshes fit, per-rank peak memory, step time, commands
(the library: `dtp/fit/`)."""

from __future__ import annotations

import json
import sys

from ..choices import FIT_TABLE_ROWS
from ..errors import PlanError
from ..fit import fit
from ..fit.report import format_table, plot

TABLE_ROWS = FIT_TABLE_ROWS  # rows printed without --all


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
            cache=args.cache,
        )
    except PlanError as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"dtp fit: {exc}", file=sys.stderr)
        return 1
    if args.plot:
        plot(report, args.plot)
    print(json.dumps(report, indent=1) if args.json else format_table(report, None if args.all else TABLE_ROWS))
    return 0
