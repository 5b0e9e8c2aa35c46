"""Run a function on N local processes joined in one process group (gloo on CPU, nccl on GPUs).

For the demo, the tests and the benchmarks; production runs use torchrun. `fn(rank, world_size,
*args)` must be importable (a module-level function) because the processes are spawned.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue as queue_module
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from ..policy import default_backend


def spawn(fn, world_size: int, *args, backend: str | None = None, timeout_s: float = 600) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` processes; return every rank's result in rank order.

    The ranks meet through a FileStore in a fresh temporary folder (no port to race for). A
    failure on any rank, a rank that dies without reporting, or no full set of results within
    `timeout_s` raises RuntimeError (with the failing rank's traceback where there is one).
    """
    ctx = _context()
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dtp-spawn-") as folder:
        store_path = os.path.join(folder, "store")
        procs = [
            ctx.Process(
                target=_worker,
                args=(rank, world_size, store_path, backend or default_backend(), fn, args, queue, dict(os.environ)),
            )
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        try:
            results = _collect(queue, procs, timeout_s)
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
    return [results[r] for r in range(world_size)]


# Imported once by the forkserver and inherited by every rank it forks (see `_context`). diffusers and
# transformers import lazily: the first model class a rank touches pulls in ~1,000 modules (3.6 CPU s per rank
# on this machine); the three below are that bulk (model base, peft loaders with torchao, pipeline base). A
# module that is not installed is skipped by the forkserver.
PRELOAD = [
    "torch",
    "torch.distributed",
    "dtp",
    "dtp.families.tiny",
    "diffusers",
    "transformers",
    "diffusers.models.modeling_utils",
    "diffusers.loaders.peft",
    "diffusers.pipelines.pipeline_utils",
]


def _context():
    """Where ranks come from: a forkserver where the platform has one, else fresh interpreters ("spawn").

    A spawned rank re-imports torch, diffusers and transformers (5-10 s of CPU each); the forkserver
    imports them once per calling process, before any thread or accelerator exists, and forks each
    rank from that state. Each rank is still a fresh process with its own process group.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _collect(queue, procs, timeout_s: float) -> dict:
    """Every rank's result; raises as soon as one rank fails or dies silently."""
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < len(procs):
        try:
            rank, ok, value = queue.get(timeout=1.0)
        except queue_module.Empty:
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
            if dead:
                raise RuntimeError(
                    f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode} before reporting"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no result from ranks {sorted(set(range(len(procs))) - set(results))} in {timeout_s} s"
                ) from None
            continue
        if not ok:
            raise RuntimeError(f"rank {rank} failed:\n{value}")
        results[rank] = torch.load(io.BytesIO(value), weights_only=False)
    return results


def _worker(rank, world_size, store_path, backend, fn, args, queue, environ):
    os.environ.clear()
    os.environ.update(environ)  # the caller's, now: a forkserver keeps the environment it started with
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)  # N processes on a few cores: oversubscription makes gloo crawl
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=300))
        result = fn(rank, world_size, *args)
        # Serialized to bytes: a tensor sent through the queue as is would be a shared-memory handle
        # that dies with this process.
        buffer = io.BytesIO()
        torch.save(result, buffer)
        queue.put((rank, True, buffer.getvalue()))
        dist.barrier()  # tear the group down together, not while a peer still works
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        _log_cpu()


def _log_cpu():
    """With DTP_CPU_LOG set, append this rank's CPU seconds and the test that spawned it (the suite's time per module:
    ranks are forked by the forkserver, so the pytest worker's own rusage never sees them)."""
    path = os.environ.get("DTP_CPU_LOG")
    if not path:
        return
    import json
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    line = {"test": os.environ.get("PYTEST_CURRENT_TEST", "?"), "rank_cpu": used.ru_utime + used.ru_stime}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
