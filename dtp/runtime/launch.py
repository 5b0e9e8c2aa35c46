"""A process launched by torchrun: join the process group, post progress, leave without a crash.

device = init_distributed(timeout_s)     # this rank's device, the group joined with its backend
with rank_progress(stall_s) as progress:  # posts to torchrun's store; a thread names a stuck rank
    ...
exit_now(0)                               # after the group is destroyed: no interpreter teardown
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ..choices import DEFAULT_TIMEOUT_S
from ..errors import PlanError
from ..policy import default_backend, default_device_type
from .placement import local_device
from .watchdog import Progress


def under_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ


def init_distributed(timeout_s: float = DEFAULT_TIMEOUT_S) -> torch.device:
    """Join torchrun's process group (the backend of this rank's device type); returns this rank's device.

    `timeout_s`: how long a collective waits for the other ranks before the group fails it.
    """
    device = local_device(default_device_type())  # cuda:<local rank>, the local Neuron core, or cpu
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(default_backend(device.type), timeout=timedelta(seconds=timeout_s))
    return device


def rank_progress(stall_s: float) -> Progress:
    """This rank's `Progress`, posted to a client of torchrun's rendezvous store (MASTER_ADDR:MASTER_PORT).

    A store of our own next to the process group: it keeps answering while the group is blocked in
    a collective, and the posts live under their own prefix.
    """
    return Progress(torchrun_store("dtp/progress/"), dist.get_rank(), dist.get_world_size(), stall_s=stall_s)


def torchrun_store(prefix: str):
    """A client of torchrun's rendezvous store (MASTER_ADDR:MASTER_PORT), its keys under `prefix`."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=30)
    )
    return dist.PrefixStore(prefix, store)


def tp_degree(world_size: int, cp: int, cfg: int = 1) -> int:
    """tp = world size / (cp * cfg), or PlanError when cp * cfg does not divide the world."""
    if cp < 1 or cfg < 1 or world_size % (cp * cfg):
        raise PlanError(f"--cp {cp} times --cfg {cfg} must divide the number of processes ({world_size}).")
    return world_size // (cp * cfg)


def exit_now(code: int = 0) -> None:
    """End a finished rank without interpreter finalization.

    Rarely (once in a full CI run here; not in 24 launches since) a gloo rank aborted after its
    work was done and its group destroyed: "terminate called without an active exception"
    (exit -6), which makes torchrun fail. Gloo worker threads that still hold tensors crash while
    the interpreter tears down (pytorch/pytorch#179291 describes it). Every output is written and
    closed by now, so flush the streams and leave without finalizing.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
