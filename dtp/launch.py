"""Run a function on N local processes joined in one process group (gloo on CPU, nccl on GPUs).

For the demo, the tests and the benchmarks; production runs use torchrun. `fn(rank, world_size,
*args)` must be importable (a module-level function) because the processes are spawned.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import socket
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"


def spawn(fn, world_size: int, *args, backend: str | None = None, timeout_s: float = 600) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` processes; return every rank's result in rank order.

    A failure on any rank raises RuntimeError carrying that rank's traceback.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(rank, world_size, port, backend or default_backend(), fn, args, queue))
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    try:
        for _ in procs:
            rank, ok, value = queue.get(timeout=timeout_s)
            if not ok:
                errors.append((rank, value))
                break
            results[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=5 if errors else timeout_s)
            if p.is_alive():
                p.terminate()
    if errors:
        rank, tb = errors[0]
        raise RuntimeError(f"rank {rank} failed:\n{tb}")
    return [results[r] for r in range(world_size)]


def _worker(rank, world_size, port, backend, fn, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)  # N processes on a few cores: oversubscription makes gloo crawl
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=300))
        result = fn(rank, world_size, *args)
        # Serialized to bytes: a tensor sent through the queue as is would be a shared-memory handle
        # that dies with this process.
        buffer = io.BytesIO()
        torch.save(result, buffer)
        queue.put((rank, True, buffer.getvalue()))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
