"""Python's cyclic garbage collector around the `dtp` command's two costly moments: its imports and its exit.

A command's module imports torch and diffusers: ~440,000 objects, none of them garbage. While they are made, the
collector runs its full pass over everything made so far several times (`dtp check flux --tp 8`: 7 full passes,
0.9 of 4.5 import CPU s, measured with `gc.callbacks`). `no_collection` pauses it for the imports only.

Once they are made, every later full pass walks them again, and the interpreter's shutdown collects over all of them
once more (`dtp check flux --tp 8`: 0.5 CPU s in `check()`'s passes, 1.1-1.4 CPU s at exit, of ~7).
`exempt_from_collection` moves every object alive into the collector's permanent generation (`gc.freeze`): called
after the imports and again when the command has answered, those passes skip them. Reference-counted objects are
still freed, atexit handlers still run, the operating system takes back the memory at exit; a cycle of objects
alive at the call is never collected (none matters: module state, and the command's report just before the exit).
Only in a process that the command line started (the caller of `main` owns any other, e.g. a test's) and only for
commands that end with no process group, device or server alive (`QUICK_EXIT`).
"""

from __future__ import annotations

import contextlib
import gc

QUICK_EXIT = ("check", "suggest", "fit")  # one process on the meta device or fake tensors: nothing to finalize


@contextlib.contextmanager
def no_collection():
    """The collector paused for the block (imports make no cyclic garbage worth a full pass), then as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def exempt_from_collection(command: str) -> None:
    """For a `QUICK_EXIT` command in its own process: later collections, shutdown's too, skip every object alive
    now."""
    if command in QUICK_EXIT:
        gc.freeze()
