"""The `dtp` command line (also `python -m dtp`).

The parsers (`commands.py`) import neither torch nor diffusers, so `--help` answers at once; a
command's module is imported only when that command runs. A user error ends as one message and
exit code 1 (`failure.py`); `--debug` re-raises it with its traceback.
"""

from __future__ import annotations

import sys

from .commands import build_parser
from .failure import USER_ERRORS, report


def command_module(name: str):
    """The module whose `run(args) -> int` does `name`'s work (`commands.COMMANDS`), imported only now: it
    imports torch. Plain imports, so the layer guard sees them."""
    if name == "demo":
        from . import demo as module
    elif name == "run":
        from . import run as module
    elif name == "check":
        from . import check as module
    elif name == "verify":
        from . import verify as module
    elif name == "suggest":
        from . import suggest as module
    elif name == "fit":
        from . import fit as module
    else:
        raise AssertionError(f"no runner for command {name!r}")  # commands.py and this list are kept equal
    return module


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return command_module(args.command).run(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        return report(error, args.command)


if __name__ == "__main__":
    sys.exit(main())
