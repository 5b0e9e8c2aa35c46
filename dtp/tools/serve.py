"""`dtp serve`: load a pipeline once, sharded over every rank, and serve generations over HTTP from rank 0.

    torchrun --nproc-per-node 2 -m dtp serve --model-dir ./FLUX.1-dev --port 8000
    curl -s localhost:8000/v1/images/generations -d '{"prompt": "a cat", "size": "1024x1024", "seed": 1}'

Started without torchrun it serves the whole pipeline from one process. `--replicas R` splits the ranks into R
copies of the sharded pipeline (world / R ranks each, the same plan and options) fed from rank 0's one queue
(`serve/replicas.py`). The loading flags are `dtp run`'s
(`commands.add_load_options`). SIGTERM (or Ctrl-C) stops every rank: rank 0 broadcasts stop at the end of
the running request; a rank still busy after `STOP_GRACE_S` leaves anyway.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from ..errors import PlanError
from ..pipeline import transformer_class
from ..pipeline.session import open_pipeline
from ..policy import default_backend, default_device_type
from ..runtime.launch import exit_now, init_distributed, torchrun_store, under_torchrun
from ..runtime.placement import local_device
from ..serve.jobs import JobQueue, Progress
from ..serve.metrics import make_metrics
from ..serve.peers import PeerFailures
from ..serve.replicas import Relay, Router, StepRecorder, layout, replica_groups, replica_mesh
from ..serve.store import JobStore
from ..serve.worker import Lockstep, fail_waiting
from .run import load_options, pipeline_args, quiet_libraries

STOP_GRACE_S = 10.0


def run(args) -> int:
    quiet_libraries()
    transformer_class(args.model_dir)  # a missing or foreign folder: one CheckpointError, before any process group
    options = load_options(args)
    defaults = pipeline_args(args.pipeline_arg)  # a PlanError before loading
    distributed = under_torchrun()
    rank = int(os.environ.get("RANK", "0"))
    replicas = args.replicas
    size, tp = _check_serve_options(args, options, distributed)
    replica, leader = rank // size, rank % size == 0
    if rank == 0:
        _check_serving(args.host, args.port)  # before minutes of loading
    stopping = _on_sigterm()
    progress, jobs, loaded = Progress(), JobQueue(args.queue), {}
    store = _open_store(args) if rank == 0 else None
    metrics = make_metrics() if rank == 0 else None
    routed = {}  # rank 0 with --replicas: "router", once loaded
    health = (lambda p: routed["router"].health(p) if routed else []) if replicas > 1 else None
    http = (loaded, jobs, progress, args, options.loras, store, defaults, metrics, health)
    server = _start_http(*http) if rank == 0 else None  # /health: 503 until loaded
    if distributed:
        _join_this_attempt(args.timeout)
    device = init_distributed(args.timeout) if distributed else local_device(default_device_type())
    mesh = None  # the whole world's, from the degrees
    if replicas > 1:
        mesh = replica_mesh(device.type, replicas, cfg=options.cfg, cp=options.cp, tp=tp)
    pipe = open_pipeline(options, device, distributed=distributed, mesh=mesh)
    group = dist.new_group(backend="gloo") if distributed else None  # objects travel over gloo, also beside NCCL
    everyone = group
    if replicas > 1:
        group = replica_groups(replicas, size, dist.new_group)[replica]
    if distributed:
        pipe.set_progress_bar_config(disable=True)
        dist.barrier(group=everyone)  # every rank has loaded
    if store is not None:  # the jobs accepted before a restart run first
        _resume(store, jobs, pipe, args, options.loras, defaults)
    batching = {"max_batch": args.max_batch, "batch_wait_s": args.batch_wait_ms / 1000, "metrics": metrics}
    source, router = jobs, None
    if replicas > 1:
        source, router = _replica_roles(rank, replica, replicas, jobs, stopping, batching)
        if router is not None:
            routed["router"] = router
    loaded["pipe"], progress.loaded = pipe, True
    print(f"dtp serve: rank {rank} ready", file=sys.stderr, flush=True)
    default = {name: options.lora_scale for name in options.loras}
    lockstep = Lockstep(pipe, group, default_lora=default, progress=progress, stopping=stopping, **batching)
    try:
        with _peers(lockstep, distributed, replica if replicas > 1 else None) as lockstep.peers:
            lockstep.run(source if leader else None)
    finally:
        _shut_down(router, server, jobs, store, args, distributed)
    print(f"dtp serve: rank {rank} stopped", file=sys.stderr, flush=True)
    exit_now(0)
    return 0


def _shut_down(router, server, jobs, store, args, distributed: bool) -> None:
    """Stop routing, then HTTP (the waiting requests fail), leave the group, drop a temporary job store."""
    if router is not None:
        router.stop(STOP_GRACE_S / 2)
    if server is not None:
        server.should_exit = True
        fail_waiting(jobs)
    if distributed:
        dist.destroy_process_group()
    if store is not None and args.state_dir is None:  # this run's temporary store
        shutil.rmtree(store.folder, ignore_errors=True)


def _check_serve_options(args, options, distributed: bool) -> tuple[int, int]:
    """PlanError before loading for a bad batching or replica option; (ranks per replica, tp degree)."""
    if args.max_batch < 1 or args.batch_wait_ms < 0:
        raise PlanError(f"--max-batch {args.max_batch} / --batch-wait-ms {args.batch_wait_ms}: at least 1 / 0.")
    if args.replicas != 1 and not distributed:
        raise PlanError(f"--replicas {args.replicas}: replicas split torchrun's ranks; launch with torchrun.")
    if args.replicas > 1 and options.ulysses not in (None, 1, options.cp):
        raise PlanError(
            f"--replicas {args.replicas} with --ulysses {options.ulysses}: a replica's mesh is a plain cp axis; serve "
            f"USP without --replicas, or give each replica plain Ulysses (--ulysses {options.cp}) or ring (1)."
        )
    if not distributed:
        return 1, 1
    return layout(int(os.environ["WORLD_SIZE"]), args.replicas, options.cp, options.cfg)


def _attempt() -> str:
    """torchrun's restart count: 0, then 1, ... after each `--max-restarts` restart."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def _join_this_attempt(timeout_s: float) -> None:
    """After a torchrun restart, join the process group through keys of this attempt only.

    torchrun (2.13, --standalone) keeps one rendezvous store across restarts, and the default group's keys carry no
    attempt: the restarted ranks read the dead ranks' addresses and fail ("Gloo connectFullMesh failed ...
    Connection refused"). So from the first restart on, the group is joined over a PrefixStore of the attempt.
    """
    if _attempt() == "0" or dist.is_initialized():
        return
    device = local_device(default_device_type())
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
    )
    dist.init_process_group(
        default_backend(device.type),
        store=dist.PrefixStore(f"dtp/serve/attempt_{_attempt()}", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout_s),
    )


def _replica_roles(rank: int, replica: int, replicas: int, jobs: JobQueue, stopping, batching: dict):
    """With --replicas: rank 0 starts the Router (returned) that feeds replicas 1 ...; another replica's leader
    takes its batches from a Relay (returned as its job source); `batching` gets the Lockstep's label and, on a
    leader other than rank 0, the StepRecorder whose step times go back to rank 0's metrics."""
    relays = torchrun_store(f"dtp/serve/replicas/{_attempt()}/")
    batching["label"] = f"replica {replica}: " if replica else ""
    if rank == 0:
        wait_s, metrics = batching["batch_wait_s"], batching["metrics"]
        router = Router(relays, jobs, replicas, max_batch=batching["max_batch"], batch_wait_s=wait_s, metrics=metrics)
        return jobs, router.start()
    recorder = StepRecorder()
    batching["metrics"] = recorder
    return Relay(relays, replica, stopping, recorder), None


def _peers(lockstep: Lockstep, distributed: bool, replica: int | None):
    """The watcher that ends every rank when a failure leaves the others inside a collective (none on one process).
    Its keys are per torchrun attempt (request numbers start again at 1 after a restart) and per replica."""
    if not distributed:
        return contextlib.nullcontext()
    store = torchrun_store(f"dtp/serve/failed/{_attempt()}/" + ("" if replica is None else f"{replica}/"))
    return PeerFailures(store, lockstep.rank, lockstep.world, give_up=lockstep.give_up)


def _check_serving(host: str, port: int) -> None:
    """PlanError when the `serve` extra is missing or the port is taken."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise PlanError(f"dtp serve needs FastAPI and uvicorn: pip install 'dtp[serve]' ({exc}).") from None
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PlanError(f"--host {host} --port {port}: cannot listen there ({exc.strerror}).") from None


def _on_sigterm() -> threading.Event:
    """An event set by SIGTERM / SIGINT; a rank that has not left `STOP_GRACE_S` later leaves anyway."""
    stopping = threading.Event()

    def handle(signum, frame) -> None:
        stopping.set()
        timer = threading.Timer(STOP_GRACE_S, exit_now, args=(0,))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stopping


def _open_store(args) -> JobStore:
    """The video jobs' store: under --state-dir (kept across restarts), else in a temporary folder of this run."""
    folder = args.state_dir or tempfile.mkdtemp(prefix="dtp-serve-")
    return JobStore(folder, keep_hours=args.keep_hours, max_attempts=args.max_attempts)


def _resume(store: JobStore, jobs: JobQueue, pipe, args, loras: dict, defaults: dict) -> None:
    from ..serve.api import Served
    from ..serve.http import resume_stored

    queued = resume_stored(store, jobs, pipe, Served(Path(args.model_dir).name, set(loras), defaults))
    if queued:
        print(f"dtp serve: {queued} job(s) from {args.state_dir} queued again", file=sys.stderr, flush=True)


def _start_http(
    loaded: dict, jobs: JobQueue, progress: Progress, args, loras: dict, store, defaults: dict, metrics, replicas
):
    """uvicorn serving the app in a thread of rank 0 (the main thread runs the lockstep loop)."""
    import uvicorn

    from ..serve.api import Served
    from ..serve.http import build_app

    served = Served(Path(args.model_dir).name, set(loras), defaults)
    app = build_app(loaded, jobs, progress, served, store=store, metrics=metrics, replicas=replicas)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    threading.Thread(target=server.run, name="dtp-serve-http", daemon=True).start()
    print(f"dtp serve: http://{args.host}:{args.port} (loading)", file=sys.stderr, flush=True)
    return server
