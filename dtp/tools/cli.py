"""The `dtp` command line (also `python -m dtp`): one subcommand per module, each with `register`."""

from __future__ import annotations

import argparse
import sys

from . import check, demo, run, suggest, verify
from .fit import command as fit

# Each module exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
COMMANDS = [demo, run, check, verify, suggest, fit]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtp", description="Tensor-parallel sharding plans for diffusion transformers."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
