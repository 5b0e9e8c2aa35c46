"""`dtp fit PIPELINE --gpus N --gpu-memory 24GiB`: which meshes fit, per-rank peak memory, step time, commands
(the library: `dtp/fit/`)."""

from __future__ import annotations

import json
import sys

from ..choices import FIT_TABLE_ROWS
from ..errors import PlanError
from ..fit import fit
from ..fit.report import format_table, keep_ulysses, plot

TABLE_ROWS = FIT_TABLE_ROWS  # rows printed without --all


def _check_plot(path: str | None) -> None:
    """PlanError before any work when --plot is asked without matplotlib (the `plot` extra) or for a non-PNG name."""
    if path is None:
        return
    if not path.lower().endswith(".png"):
        raise PlanError(f"dtp fit --plot {path!r}: the chart is a PNG; give a FILE.png.")
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlanError(f"dtp fit --plot needs matplotlib: pip install 'dtp[plot]' ({exc}).") from None


def run(args) -> int:
    try:
        _check_plot(args.plot)
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
            compile=args.compile,
            fsdp_unit=args.fsdp_unit,
            attention_backend=args.attention_backend,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            inter_node=args.inter_node,
            replicas=args.replicas,
        )
    except PlanError as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"dtp fit: {exc}", file=sys.stderr)
        return 1
    if args.ulysses is not None:
        report = keep_ulysses(report, args.ulysses)
    if args.plot:
        plot(report, args.plot)
    print(json.dumps(report, indent=1) if args.json else format_table(report, None if args.all else TABLE_ROWS))
    return 0
