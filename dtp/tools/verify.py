"""`dtp verify`: the command line of `dtp.analysis.verify` (parses arguments, prints the report)."""

from __future__ import annotations

import json
import sys

from ..analysis.fakepg import config_arg
from ..analysis.verify import DEFAULT_TOL, verify
from ..errors import PlanError
from ..families import FAMILIES


def register(sub) -> None:
    p = sub.add_parser("verify", help="run a plan sharded on local gloo processes; name the first module that diverges")
    p.add_argument("model", metavar="MODEL", help="diffusers class name (e.g. Flux2Transformer2DModel)")
    p.add_argument("--plan", help="bundled plan name or YAML path (default: plan_for the class)")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel degree = number of local processes")
    p.add_argument(
        "--config", help="config.json path or an inline JSON object (default: the tiny config of a known class)"
    )
    p.add_argument("--tol", type=float, default=DEFAULT_TOL, help=f"relative tolerance (default {DEFAULT_TOL:g})")
    p.add_argument("--unchecked", action="store_true", help="skip the pair and attention checks (see dtp.verify)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run)


def run(args) -> int:
    """0 when every site is within tolerance; 1 on a divergence, a failed forward or a PlanError."""
    try:
        if args.config is None and args.model not in FAMILIES:
            raise PlanError(
                f"dtp verify: no tiny config for {args.model}; pass --config (a small one: it runs on CPU)."
            )
        report = verify(
            args.model,
            args.plan,
            args.tp,
            tol=args.tol,
            checks=not args.unchecked,
            config=config_arg(args.config, "dtp verify"),
        )
    except PlanError as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"dtp verify: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    return 0 if report.ok else 1
