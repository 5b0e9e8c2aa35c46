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
