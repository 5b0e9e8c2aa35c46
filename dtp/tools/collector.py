"""Python's cyclic garbage collector around the `dtp` command's two costly moments: its imports and its exit.

A command's module imports torch and diffusers: ~440,000 objects, none of them garbage. While they are made, the
collector runs its full pass over everything made so far several times (`dtp check flux --tp 8`: 7 full passes,
0.9 of 4.5 import CPU s, measured with `gc.callbacks`). `no_collection` pauses it for the imports only.

When a one-process command has answered, the interpreter's shutdown collects again, over every one of those
objects (1.1-1.4 CPU s of `dtp check flux --tp 8`'s ~7). `skip_final_collection` moves them out of the collector's
sight (`gc.freeze`): the process ends next, reference-counted objects are still freed, atexit handlers still run, the
operating system takes back the memory. Only for a process that the command line started (the caller of `main`
owns any other) and only for commands that end with no process group, device or server alive (`QUICK_EXIT`).
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


def skip_final_collection(command: str) -> None:
    """For a `QUICK_EXIT` command whose process ends next: shutdown's collection skips every object alive now."""
    if command in QUICK_EXIT:
        gc.freeze()
