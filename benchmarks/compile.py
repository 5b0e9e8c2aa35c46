"""Cold-compile time and correctness of torch.compile on a dtp-sharded tiny FLUX.1, every case and both forms.

Cases (2 gloo processes each): tp=2, cp=2 Ulysses, cp=2 ring, tp=2 with pad=True (3 heads -> 4), tp=2 with a
LoRA on every Linear. Forms: `torch.compile(model)` ("full") and diffusers' regional
`model.compile_repeated_blocks(fullgraph=True)` ("regional"). For each: graph breaks, graphs compiled by the
first step, recompilations over the next 2 steps (3 timesteps), the first call's wall and CPU seconds on rank 0
(the cold compile, dynamo's caches reset before each case), and max |compiled - eager| / max |eager|. Usage:

    python benchmarks/compile.py [--backend inductor] [--cases tp,pad] [--forms full,regional]

Writes benchmarks/results/compile.md (the suite's cheaper matrix: tests/distributed/test_compile.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "distributed"))  # the worker side is shared with the test

from compile_cases import CASES, FORMS, run_matrix  # noqa: E402

from dtp.testing.launch import spawn  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "compile.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--forms", default=",".join(FORMS))
    args = parser.parse_args()
    matrix = [(c, f, args.backend) for c in args.cases.split(",") for f in args.forms.split(",")]
    results = spawn(run_matrix, 2, matrix, partial(write_partial, args.backend, time.perf_counter()), timeout_s=7200)
    print(write_partial(args.backend, None, results[0], results))


def write_partial(backend: str, start: float | None, rank0: dict, ranks: list[dict] | None = None) -> str:
    """The table so far (rank 0's results while the run goes on; every rank's at the end) into RESULT."""
    wall = "" if start is None else f"{time.perf_counter() - start:.0f} s so far"
    table = format_table(ranks or [rank0], backend, wall)
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(table + "\n")
    return table


def format_table(results: list[dict], backend: str, wall: str) -> str:
    lines = [
        f"# torch.compile on a dtp-sharded tiny FLUX.1 (backend {backend}, 2 gloo processes, "
        f"{os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})",
        "",
        "| case | form | graph breaks | graphs | recompiles (steps 2-3) | cold compile s (wall) | cold compile s (CPU) "
        "| max rel diff vs eager |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in results[0].items():
        if "error" in r:
            lines.append(f"| {key[0]} | {key[1]} | raised: {r['error'][:300]} | | | | | |")
            continue
        worst = max(rank[key]["rel"] for rank in results)
        breaks = max(rank[key]["graph_breaks"] for rank in results)
        lines.append(
            f"| {key[0]} | {key[1]} | {breaks} | {r['graphs']} | {r['recompiles']} | {r['first_call_s']:.1f} "
            f"| {r['first_call_cpu_s']:.1f} | {worst:.1e} |"
        )
    lines += ["", f"rank 0's times; graph breaks and diff: the worst rank of those reported. {wall}".rstrip()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
