"""Stress: run distributed test modules N times in a row, and loop the two historic gloo crashes, counting failures.

Not part of the default test run (it takes minutes). Three modes, each printing a table and writing
`benchmarks/results/stress-<mode>.md` with every failure's traceback (the tail of its output):

    python benchmarks/stress.py modules -n 5 tests/distributed/test_ranks_disagree.py \
        tests/distributed/test_tp_parity_2.py
    python benchmarks/stress.py async --iterations 300        # sharded forwards, output collective sync vs async
    python benchmarks/stress.py exit --launches 20            # gloo ranks that exit normally vs via os._exit

`modules`: each module runs in a fresh `python -m pytest` (its own spawned process group), N times.
`async`: 2 gloo ranks run tiny-Flux sharded forwards in a loop, once with the output collectives
synchronous (what `styles/parallel.py::_overlap` picks on CPU) and once forced asynchronous (what
it picked before): a rank that dies ("malloc(): unaligned tcache chunk detected", "Connection reset
by peer") fails its launch. `exit`: 2 gloo ranks, torchrun-style (own processes, exit code read),
run a sharded forward, destroy the group and either exit normally (interpreter finalization) or
leave through `os._exit` (what `dtp run::_exit_now` does); a nonzero exit code ("terminate called
without an active exception" is -6, SIGABRT) is a failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SIGNATURES = {  # known crash texts -> short name, counted in the tables
    "unaligned tcache chunk": "tcache",
    "terminate called without an active exception": "terminate",
    "Connection reset by peer": "reset",
    "died with exit code": "died",
    "Timed out": "timeout",
    "no result from ranks": "spawn timeout",
}
TAIL_CHARS = 4000


def _signatures(text: str) -> str:
    return ", ".join(name for needle, name in SIGNATURES.items() if needle in text) or "-"


def _run(command: list[str], timeout_s: float, env=None) -> tuple[int, float, str]:
    """(exit code, seconds, stdout+stderr) of `command`; exit code 124 when it ran past `timeout_s`."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})}
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, output = 124, f"timed out after {timeout_s} s\n{expired.stdout or ''}{expired.stderr or ''}"
    return code, time.monotonic() - start, output


# ---- modules ------------------------------------------------------------------------------------


def stress_modules(modules: list[str], n: int, timeout_s: float) -> tuple[list[str], list[str]]:
    runs: dict[str, list[tuple[int, float, str]]] = {m: [] for m in modules}
    for i in range(n):
        for module in modules:
            code, seconds, output = _run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module], timeout_s
            )
            runs[module].append((code, seconds, output))
            print(f"run {i + 1}/{n} {module}: exit {code} in {seconds:.0f} s ({_signatures(output) if code else 'ok'})")
    rows = ["| module | runs | failures | rate | median s | crash signatures |", "|---|---|---|---|---|---|"]
    failures = []
    for module, results in runs.items():
        bad = [(i, r) for i, r in enumerate(results) if r[0] != 0]
        seconds = sorted(r[1] for r in results)[len(results) // 2]
        sigs = ", ".join(_signatures(r[2]) for _, r in bad) or "-"
        rows.append(
            f"| {module} | {len(results)} | {len(bad)} | {len(bad) / len(results):.2f} | {seconds:.0f} | {sigs} |"
        )
        failures += [f"### {module}, run {i + 1}: exit {r[0]}\n```\n{r[2][-TAIL_CHARS:]}\n```" for i, r in bad]
    return rows, failures


# ---- async: the heap corruption -------------------------------------------------------------------


def _forward_loop(rank, world_size, iterations: int, overlap: bool) -> int:
    """Sharded tiny-Flux forwards in a loop, the output collectives forced sync or async; returns the count run."""
    import torch

    import dtp
    from dtp.runtime import styles
    from dtp.testing.tiny import tiny_inputs, tiny_model

    styles._overlap = lambda mesh: overlap  # the switch under test; the product picks `mesh.device_type != "cpu"`
    cls = "FluxTransformer2DModel"
    model = dtp.parallelize(tiny_model(cls), dtp.make_mesh(tp=world_size))
    inputs = tiny_inputs(cls)
    with torch.no_grad():
        for _ in range(iterations):
            model(**inputs)
    return iterations


def stress_async(iterations: int, launches: int, timeout_s: float) -> tuple[list[str], list[str]]:
    rows = ["| output collective | launches x forwards | failed launches | crash signatures |", "|---|---|---|---|"]
    failures = []
    for overlap in (False, True):
        bad, times = [], []
        for i in range(launches):
            code, seconds, output = _run(
                [sys.executable, __file__, "_forward_loop", str(iterations), str(int(overlap)), str(timeout_s - 60)],
                timeout_s,
            )
            status = _signatures(output) if code else "ok"
            print(f"async={overlap} launch {i + 1}/{launches}: exit {code} in {seconds:.0f} s ({status})")
            times.append(seconds)
            if code:
                bad.append((i, code, output))
        name = "async (before)" if overlap else "sync (now, on CPU)"
        name += f", median {sorted(times)[len(times) // 2]:.0f} s per launch"
        sigs = ", ".join(_signatures(o) for _, _, o in bad) or "-"
        rows.append(f"| {name} | {launches} x {iterations} | {len(bad)} | {sigs} |")
        failures += [f"### {name}, launch {i + 1}: exit {c}\n```\n{o[-TAIL_CHARS:]}\n```" for i, c, o in bad]
    return rows, failures


# ---- exit: the abort at interpreter finalization -------------------------------------------------


def _exit_worker(rank: int, world_size: int, store_path: str, hard_exit: bool, overlap: bool) -> None:
    """One rank as torchrun would run it: join, shard, forward, barrier, destroy, exit."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import dtp
    from dtp.runtime import styles
    from dtp.testing.tiny import tiny_inputs, tiny_model

    styles._overlap = lambda mesh: overlap
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    cls = "FluxTransformer2DModel"
    model = dtp.parallelize(tiny_model(cls), dtp.make_mesh(tp=world_size))
    with torch.no_grad():
        model(**tiny_inputs(cls))
    dist.barrier()
    dist.destroy_process_group()
    if hard_exit:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _exit_command(rank: int, store: str, hard_exit: bool, overlap: bool) -> list[str]:
    flags = [str(int(hard_exit)), str(int(overlap))]
    return [sys.executable, __file__, "_exit_worker", str(rank), "2", store, *flags]


def stress_exit(launches: int, timeout_s: float, overlap: bool) -> tuple[list[str], list[str]]:
    collective = "async" if overlap else "sync"
    rows = [
        "| exit | output collective | launches (2 ranks each) | ranks with nonzero exit | exit codes |",
        "|---|---|---|---|---|",
    ]
    failures = []
    for hard in (False, True):
        codes = []
        for i in range(launches):
            with tempfile.TemporaryDirectory(prefix="dtp-stress-") as folder:
                store = os.path.join(folder, "store")
                procs = [
                    subprocess.Popen(
                        _exit_command(rank, store, hard, overlap),
                        cwd=ROOT,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                    for rank in range(2)
                ]
                for rank, p in enumerate(procs):
                    try:
                        output, _ = p.communicate(timeout=timeout_s)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        output, _ = p.communicate()
                    codes.append(p.returncode)
                    if p.returncode:
                        failures.append(
                            f"### exit {'os._exit' if hard else 'normal'}, launch {i + 1}, rank {rank}: "
                            f"exit {p.returncode}\n```\n{output[-TAIL_CHARS:]}\n```"
                        )
            print(f"hard_exit={hard} launch {i + 1}/{launches}: exit codes {codes[-2:]}")
        nonzero = [c for c in codes if c]
        name = "os._exit after destroy (now, dtp run)" if hard else "normal interpreter exit"
        rows.append(f"| {name} | {collective} | {launches} | {len(nonzero)} | {sorted(set(codes))} |")
    return rows, failures


# ---- main ---------------------------------------------------------------------------------------


def write(mode: str, command: str, rows: list[str], failures: list[str]) -> None:
    print("\n".join(rows))
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = f"# Stress: {mode}\n\nCommand: `{command}` (2 CPU cores shared with other jobs).\n\n" + "\n".join(rows)
    text += "\n\n## Failures\n\n" + ("\n\n".join(failures) if failures else "none") + "\n"
    (RESULTS / f"stress-{mode}.md").write_text(text)  # one file per mode; a later run of a mode replaces it


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_forward_loop":  # one launch of `async`, in its own interpreter
        from dtp.testing.launch import spawn

        spawn(_forward_loop, 2, int(argv[1]), bool(int(argv[2])), timeout_s=float(argv[3]))
        return
    if argv and argv[0] == "_exit_worker":
        _exit_worker(int(argv[1]), int(argv[2]), argv[3], bool(int(argv[4])), bool(int(argv[5])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("modules")
    p.add_argument("modules", nargs="+")
    p.add_argument("-n", type=int, default=20)
    p.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    p = sub.add_parser("async")
    p.add_argument("--iterations", type=int, default=300, help="forwards per launch")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900)
    p = sub.add_parser("exit")
    p.add_argument("--launches", type=int, default=20)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--async", dest="overlap", action="store_true", help="output collectives asynchronous (as before)")
    args = parser.parse_args(argv)
    command = "python benchmarks/stress.py " + " ".join(argv)
    if args.mode == "modules":
        rows, failures = stress_modules(args.modules, args.n, args.timeout)
    elif args.mode == "async":
        rows, failures = stress_async(args.iterations, args.launches, args.timeout)
    else:
        rows, failures = stress_exit(args.launches, args.timeout, args.overlap)
    write(args.mode + ("-async" if getattr(args, "overlap", False) else ""), command, rows, failures)


if __name__ == "__main__":
    main()
