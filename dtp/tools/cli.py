"""The `dtp` command line (also `python -m dtp`).

The parsers (`commands.py`) import neither torch nor diffusers, so `--help` answers at once; a
command's module (`commands.COMMANDS[name].module()`) is imported only when that command runs, after the checks
that need no torch (`early.py`). A user error ends as one message and exit code 1 (`failure.py`); `--debug`
re-raises it with its traceback.
"""

from __future__ import annotations

import sys

from .collector import exempt_from_collection, no_collection
from .commands import COMMANDS, build_parser
from .early import check_arguments
from .failure import USER_ERRORS, report, report_early


def command_module(name: str):
    """The module whose `run(args) -> int` does `name`'s work, imported only now: it imports torch (the garbage
    collector paused meanwhile: `collector.py`)."""
    with no_collection():
        return COMMANDS[name].module()


def main(argv=None) -> int:
    """Run the command `argv` names (None: `sys.argv`, i.e. this process is the `dtp` command, which ends next)."""
    args = build_parser().parse_args(argv)
    try:
        check_arguments(args)  # what is wrong without torch, before torch and diffusers load (`early.py`)
    except USER_ERRORS as error:
        if args.debug:
            raise
        return report_early(error, args.command)
    with no_collection():
        from ..quant.noise import quiet_torchao  # here, not at the top: `dtp --help` imports no torch

    quiet_torchao()  # before the command imports transformers, which imports torchao
    own_process = argv is None  # the `dtp` command itself, which ends when this returns
    try:
        module = command_module(args.command)
        if own_process:
            exempt_from_collection(args.command)  # what the imports made: no later full pass walks it
        return module.run(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        return report(error, args.command)
    finally:
        if own_process:
            exempt_from_collection(args.command)  # nor shutdown's collection


if __name__ == "__main__":
    sys.exit(main())
