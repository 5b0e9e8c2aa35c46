"""`dtp suggest`: the command line of `dtp.analysis.suggest` (parses arguments, prints the report)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..analysis.fakepg import config_arg
from ..analysis.suggest import rank_fraction, suggest
from ..errors import PlanError
from ..families import FAMILIES
from ..families import example_inputs as known_inputs
from ..families.tiny import random_model


def register(sub) -> None:
    p = sub.add_parser("suggest", help="propose a plan for a model from one traced forward of a small instance")
    p.add_argument("model", metavar="MODEL", help="diffusers class name (e.g. Flux2Transformer2DModel)")
    p.add_argument(
        "--config", help="config.json path or an inline JSON object (default: the tiny config of a known class)"
    )
    p.add_argument("--tp", type=int, default=2, help="TP degree the suggestion must divide (default 2)")
    p.add_argument("-o", "--output", help="write the plan YAML here (default: print it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.config is None and args.model not in FAMILIES:
            raise PlanError(f"dtp suggest: no tiny config for {args.model}; pass --config (a small one).")
        config = config_arg(args.config, "dtp suggest") if args.config else dict(FAMILIES[args.model].tiny)
        model = random_model(args.model, config)
        suggestion = suggest(model, known_inputs(args.model, config), tp=args.tp)
    except PlanError as exc:
        print(f"dtp suggest: {exc}", file=sys.stderr)
        return 1
    text = suggestion.to_yaml()
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text, end="")
    share = rank_fraction(model, suggestion.plan, args.tp)
    print(
        f"dtp suggest: {len(suggestion.plan.rules)} rules; at tp={args.tp} a rank holds {share:.0%} of the weights; "
        f"check it with `dtp verify {args.model} --plan PLAN --tp {args.tp}`.",
        file=sys.stderr,
    )
    return 0
