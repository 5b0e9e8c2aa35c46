"""`dtp verify`: the command line of `dtp.analysis.verify` (parses arguments, prints the report)."""

from __future__ import annotations

import json
import sys

from ..analysis.fakepg import config_arg
from ..analysis.verify import verify
from ..errors import PlanError
from ..families import FAMILIES


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
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format(verbose=args.verbose))
    return 0 if report.ok else 1
