"""`dtp serve` started the way a user starts it, for tests and benchmarks: torchrun in a session of its own, its
output in a log file, an HTTP client once `GET /health` answers 200 (every rank loaded), and a stop that ends the
whole process group.

    with serving(model_dir, tmp_path / "server.log", "--cp", "2") as server:
        server.client.post("/v1/images/generations", json={...})

`script` runs a wrapper instead of `-m dtp` (a test's planted fault, `tests/distributed/serve_fault.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = [sys.executable, "-m", "torch.distributed.run"]
STARTUP_S = 300  # loading the tiny pipelines takes seconds; a busy 2-core machine can stretch it a lot
STOP_S = 30  # SIGTERM ends every rank within seconds (docs/serve.md); past this the group is killed


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_env(**extra: str) -> dict:
    """This process's environment with one thread per rank (2 cores shared by every rank) and `extra`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


@dataclass(frozen=True)
class Server:
    """A started server: its torchrun process (the leader of its own session), its URL, a client on it, its log."""

    process: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    client: object  # httpx.Client with `url` as its base URL
    log: Path


def start(model_dir, log: Path, *args: str, nproc: int = 2, script=None, env=None, launch=()) -> Server:
    """torchrun `nproc` ranks of `dtp serve --model-dir model_dir --dtype fp32 *args`; returns once healthy.
    `launch`: more torchrun options (e.g. "--max-restarts", "1")."""
    import httpx

    port = free_port()
    target = [str(script)] if script else ["-m", "dtp"]
    command = [*LAUNCHER, "--standalone", f"--nproc-per-node={nproc}", *launch, *target]
    command += ["serve", "--model-dir", str(model_dir), "--port", str(port), "--dtype", "fp32", *args]
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            command, env=env or quiet_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    server = Server(process, url, httpx.Client(base_url=url, timeout=300), log)
    try:
        wait_healthy(server)
    except BaseException:
        stop(server)
        raise
    return server


def wait_healthy(server: Server, timeout_s: float = STARTUP_S) -> None:
    """Until `GET /health` answers 200; AssertionError with the log's tail if the launcher exits or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.process.poll() is None, server.log.read_text()[-3000:]
        try:
            if server.client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the server did not become healthy in {timeout_s:.0f} s: {server.log.read_text()[-3000:]}")


def stop(server: Server, timeout_s: float = STOP_S) -> int:
    """SIGTERM to the server's process group, SIGKILL if it outlives `timeout_s`; the launcher's exit code.

    torchrun starts each rank in a session of its own and may exit before a rank blocked in a collective does (such
    a rank never runs its SIGTERM handler): the ranks it had are killed too, so that no test leaves one behind.
    """
    server.client.close()
    ranks = rank_processes(server)
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()
    for pid in alive(ranks):  # still that rank, not a new process that got its number
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return server.process.returncode


def rank_processes(server: Server) -> dict[int, bytes]:
    """`{pid: command line}` of the ranks torchrun started (Linux's /proc; none once torchrun has exited)."""
    pid = server.process.pid
    try:
        children = [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return {}
    return {child: _command(child) for child in children}


def rank_of(pid: int) -> int | None:
    """The RANK a torchrun child runs as (its environment), None when it is gone."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(v.partition(b"=")[2]) for v in environ if v.startswith(b"RANK=")]
    return ranks[0] if ranks else None


def alive(ranks: dict[int, bytes]) -> list[int]:
    """The pids of `ranks` (from `rank_processes`) still running as those ranks."""
    return [pid for pid, command in ranks.items() if _command(pid) == command]


def _command(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


@contextmanager
def serving(model_dir, log: Path, *args: str, **options) -> Iterator[Server]:
    """`start(...)`, then `stop` on the way out whatever happened."""
    server = start(model_dir, log, *args, **options)
    try:
        yield server
    finally:
        stop(server)
