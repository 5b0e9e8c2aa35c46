"""A failed command ends as one clear message and exit code 1, not a traceback per rank.

A user's mistake (a `PlanError`, a `CheckpointError`, a `ForwardError`: a plan that does not fit, a
missing or damaged checkpoint, an input the sharded model cannot take) is printed as `dtp <command>:
<message>` on stderr; `--debug` shows the traceback instead. Anything else is a bug and keeps its traceback.

Under torchrun every rank fails on its own, and the launcher kills the other ranks as soon as one exits
non-zero, so a rank must not exit before the message is out. Each failed rank posts its message to the
launcher's store (MASTER_ADDR:MASTER_PORT); rank 0 waits `GATHER_S` for the others, prints the message
once (one line per rank when the ranks' messages differ) and posts what it printed; every other rank
waits for that (`ACK_S`) and prints its own line only when rank 0 did not print it (rank 0 did not
fail, or failed differently and late). Each rank also writes torchrun's error file
(TORCHELASTIC_ERROR_FILE), so the launcher's closing summary names the message instead of
"To enable traceback see ...".

A mistake `early.py` finds before torch is imported (`report_early`) is the same on every rank of a node (the
same arguments, the same files), so no store is needed to agree (and none is joined: that would import torch):
local rank 0 prints it, the node's other ranks wait `EARLY_WAIT_S` for the launcher to end them (a rank that left
first could get local rank 0 killed before it printed), then leave with exit code 1 too.
"""

from __future__ import annotations

import json
import os
import sys
import time

from ..errors import ForwardError, PlanError

# CheckpointError is a PlanError; a missing --model-dir is reported as a CheckpointError.
USER_ERRORS = (PlanError, ForwardError)

GATHER_S = 3.0  # how long rank 0 waits for the other ranks' messages before printing
ACK_S = 10.0  # how long another rank waits for rank 0 to print before printing its own line
STORE_PREFIX = "dtp/failed/"
EARLY_WAIT_S = 5.0  # how long a local rank other than 0 waits for the launcher before leaving on an early error


def message(error: BaseException, command: str) -> str:
    """`dtp <command>: <message>`, without doubling a prefix the message already has."""
    text = str(error).strip() or type(error).__name__
    prefix = f"dtp {command}:"
    return text if text.startswith(prefix) else f"{prefix} {text}"


def report(error: BaseException, command: str) -> int:
    """Print `error` as one message (see the module docstring) and return the exit code, 1."""
    text = message(error, command)
    if _under_torchrun():
        _write_error_file(error, text)
        _report_rank(text, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), _store)
        _exit(1)
    else:
        _print(text)
    return 1


def report_early(error: BaseException, command: str) -> int:
    """Print `error`, found before torch was imported, as one message per node (see the module docstring); 1."""
    text = message(error, command)
    if not _under_torchrun():
        _print(text)
        return 1
    _write_error_file(error, text)  # first: the launcher's summary names it on a rank it ends while waiting
    if os.environ.get("LOCAL_RANK", "0") == "0":
        rank = os.environ["RANK"]
        _print(text if rank == "0" else f"rank {rank}: {text}")
    else:
        time.sleep(EARLY_WAIT_S)  # local rank 0 prints, exits, and the launcher ends this rank meanwhile
    _exit(1)
    return 1


def format_ranks(messages: dict[int, str]) -> str:
    """One message when every rank says the same, else one line per distinct message naming its ranks.

    {0: "dtp run: a", 1: "dtp run: a"} -> "dtp run: a"
    {0: "dtp run: a", 1: "dtp run: b"} -> "rank 0: dtp run: a" / "rank 1: dtp run: b" (two lines)
    """
    distinct: dict[str, list[int]] = {}
    for rank in sorted(messages):
        distinct.setdefault(messages[rank], []).append(rank)
    if len(distinct) == 1:
        return next(iter(distinct))
    return "\n".join(f"{_ranks(ranks)}: {text}" for text, ranks in distinct.items())


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _under_torchrun() -> bool:
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _report_rank(text: str, rank: int, world_size: int, connect) -> None:
    """This rank's part of printing one message for all ranks (see the module docstring); `connect()` -> the
    shared store."""
    try:
        store = connect()
        store.set(f"{rank}", text)
        if rank == 0:
            messages = _gather(store, world_size, text)
            _print(format_ranks(messages))
            store.set("printed", json.dumps(sorted(set(messages.values()))))
        elif text not in _printed_by_rank_0(store):
            _print(f"rank {rank}: {text}")
    except Exception:  # noqa: BLE001 - no store to agree through (it went away with rank 0): say it here
        _print(f"rank {rank}: {text}")


def _gather(store, world_size: int, own: str) -> dict[int, str]:
    """{rank: message} of every rank that posted one within GATHER_S (rank 0's own at once)."""
    deadline = time.monotonic() + GATHER_S
    found = {0: own}
    while True:
        for rank in range(1, world_size):
            if rank not in found and store.check([f"{rank}"]):
                found[rank] = store.get(f"{rank}").decode()
        if len(found) == world_size or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _printed_by_rank_0(store) -> list[str]:
    """The messages rank 0 printed, or [] when it printed nothing within ACK_S."""
    deadline = time.monotonic() + ACK_S
    while time.monotonic() < deadline:
        if store.check(["printed"]):
            return json.loads(store.get("printed").decode())
        time.sleep(0.1)
    return []


def _store():
    """A client of torchrun's rendezvous store, under this module's own key prefix."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=10)
    )
    return dist.PrefixStore(STORE_PREFIX, store)


def _write_error_file(error: BaseException, text: str) -> None:
    """torchrun's per-rank error file (the format of torch.distributed.elastic's `record`): its summary
    then shows `text` as this rank's "traceback" line."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": f"{type(error).__name__}: {error}",
            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))},
        }
    }
    try:
        with open(path, "w") as handle:
            json.dump(data, handle)
    except OSError:
        pass  # the summary then says "To enable traceback see ..."; the message is printed anyway


def _print(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _exit(code: int) -> None:
    """End a torchrun rank without interpreter finalization: gloo threads that still hold tensors can abort
    the process while it tears down (see `run._exit_now`), which would turn exit code 1 into a signal."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
