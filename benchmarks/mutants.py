"""Mutation check: deliberate one-line bugs in the product, each run against the tests that cover it.

Each mutant replaces one line of one product file (the old text must occur exactly once) in a temporary copy
of the tree, never in the working tree, and runs its covering test modules there (`PYTHONPATH` at the copy,
`pytest -x`). A mutant is killed when a test fails (or the run times out: a hang is caught too), survived when
every test passes. Every survivor is a missing test.

    nice python benchmarks/mutants.py                  # all; writes benchmarks/results/mutants.md
    nice python benchmarks/mutants.py --only ring-merge-weight vae-halo-short
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "mutants.md"
TIMEOUT_S = 1200
UNIT, DIST = "tests/unit", "tests/distributed"


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str
    path: str  # product file, relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]  # covering test modules, cheapest first (pytest -x stops at the first failure)


MUTANTS = (
    Mutant(
        "slice-ranks-reversed",
        "slicing",
        "dtp/resolve/layout.py",
        "lo, hi = part * chunk, (part + 1) * chunk",
        "lo, hi = (parts - 1 - part) * chunk, (parts - part) * chunk",
        (f"{UNIT}/test_slicing.py", f"{UNIT}/test_padding.py"),
    ),
    Mutant(
        "assemble-order",
        "slicing",
        "dtp/resolve/layout.py",
        "distinct = list(locals_)[::replicas]",
        "distinct = list(locals_)[::replicas][::-1]",
        (f"{UNIT}/test_slicing.py", f"{UNIT}/test_padding.py"),
    ),
    Mutant(
        "kv-replicas-ignored",
        "slicing",
        "dtp/resolve/binding/heads.py",
        "attr: value * self.kv_replicas // tp if attr in KV_COUNTS + KV_WIDTH_ATTRS else value // tp",
        "attr: value // tp if attr in KV_COUNTS + KV_WIDTH_ATTRS else value // tp",
        (f"{UNIT}/test_text_plans.py",),
    ),
    Mutant(
        "heads-not-rewritten",
        "slicing",
        "dtp/resolve/binding/heads.py",
        "attr: value * self.kv_replicas // tp if attr in KV_COUNTS + KV_WIDTH_ATTRS else value // tp",
        "attr: value * self.kv_replicas // tp if attr in KV_COUNTS + KV_WIDTH_ATTRS else value",
        (f"{UNIT}/test_padding.py", f"{DIST}/test_tp_parity_2.py"),
    ),
    Mutant(
        "lora-factor-swapped",
        "slicing",
        "dtp/styles/base.py",
        'return "lora_B" if self.shard_dim == 0 else "lora_A"',
        'return "lora_A" if self.shard_dim == 0 else "lora_B"',
        (f"{UNIT}/test_lora_split.py",),
    ),
    Mutant(
        "missing-output-collective",
        "collectives",
        "dtp/styles/parallel.py",
        "if output.placements != (self.output_placement,):",
        "if False:",
        (f"{DIST}/test_tp_parity_2.py",),
    ),
    Mutant(
        "norm-per-rank-statistic",
        "collectives",
        "dtp/runtime/norms.py",
        "squares = all_reduce(xf.pow(2).sum(-1, keepdim=True), self.tp.group)",
        "squares = xf.pow(2).sum(-1, keepdim=True)",
        (f"{DIST}/test_coverage_parity.py",),  # Wan's QK-norm across heads: the first four plans have none
    ),
    Mutant(
        "fp8-local-amax",
        "collectives",
        "dtp/quant/dynamic.py",
        'amax = funcol.all_reduce(local_amax, "max", mesh.get_group())',
        "amax = local_amax",
        (f"{DIST}/test_quant_parity_4.py",),
    ),
    Mutant(
        "cp-chunk-of-rank-0",
        "slicing",
        "dtp/runtime/cp/sequence.py",
        "return x.narrow(dim, rank * size, size)",
        "return x.narrow(dim, 0, size)",
        (f"{UNIT}/test_cp_math.py", f"{DIST}/test_cp_parity.py"),
    ),
    Mutant(
        "mask-gather-order",
        "masks",
        "dtp/runtime/cp/masks.py",
        "full = all_gather_last(dense(wire), group)",
        "full = all_gather_last(dense(wire), group).roll(wire.shape[1], 1)",
        (f"{DIST}/test_cp_parity.py",),
    ),
    Mutant(
        "ring-merge-weight",
        "collectives",
        "dtp/runtime/cp/ring.py",
        "diff = lse_a - lse_b",
        "diff = lse_b - lse_a",
        (f"{UNIT}/test_cp_math.py", f"{DIST}/test_cp_parity.py"),
    ),
    Mutant(
        "ulysses-chunk-order",
        "collectives",
        "dtp/runtime/cp/ulysses.py",
        "whole = recv.transpose(0, 1).reshape(b, cp * s, n, h // cp, d)",
        "whole = recv.flip(0).transpose(0, 1).reshape(b, cp * s, n, h // cp, d)",
        (f"{UNIT}/test_cp_math.py", f"{DIST}/test_cp_parity.py"),
    ),
    Mutant(
        "cfg-rows-swapped",
        "cfg exchange",
        "dtp/runtime/cfg/batch.py",
        "start = index * base + min(index, extra)",
        "start = (parts - 1 - index) * base + min(parts - 1 - index, extra)",
        (f"{UNIT}/test_cfg.py", f"{DIST}/test_cfg_parity_2.py"),
    ),
    Mutant(
        "cfg-join-swapped",
        "cfg exchange",
        "dtp/runtime/cfg/batch.py",
        "return torch.cat(parts)",
        "return torch.cat(parts[::-1])",
        (f"{UNIT}/test_cfg.py", f"{DIST}/test_cfg_parity_2.py"),
    ),
    Mutant(
        "vae-halo-row-short",
        "VAE halos",
        "dtp/vae/halo.py",
        "return max(0, rows.top - rows.zeros_top), max(0, rows.bottom - rows.zeros_bottom)",
        "return max(0, rows.top - rows.zeros_top), max(0, rows.bottom - rows.zeros_bottom - 1)",
        (f"{UNIT}/test_vae_strips.py", f"{DIST}/test_vae_parity.py"),
    ),
    Mutant(
        "param-bytes-fp32",
        "fit bytes",
        "dtp/runtime/memory.py",
        "return local.numel() * local.element_size()",
        "return local.numel() * 4",
        (f"{UNIT}/test_fit.py", f"{UNIT}/test_check.py"),
    ),
    Mutant(
        "all-reduce-wire-bytes",
        "fit bytes",
        "dtp/fit/cost.py",
        "return 2 * (group - 1) / group * nbytes",
        "return (group - 1) / group * nbytes",
        (f"{UNIT}/test_fit.py",),
    ),
    Mutant(
        "pair-check-off",
        "plan checks",
        "dtp/resolve/binding/pairs.py",
        "    if not partners:\n        raise PlanError(",
        "    if False:\n        raise PlanError(",
        (f"{UNIT}/test_bad_plans.py", f"{UNIT}/test_check.py"),
    ),
    Mutant(
        "divisibility-check-off",
        "plan checks",
        "dtp/resolve/binding/constraints.py",
        "failed = [c for c in constraints if not c.allows(tp)]",
        "failed = []",
        (f"{UNIT}/test_check.py", f"{UNIT}/test_bad_plans.py"),
    ),
)


def copy_tree(target: Path) -> None:
    """The working tree without git, caches, the environment and benchmark results."""
    ignore = shutil.ignore_patterns(".git", "__pycache__", ".venv", ".pytest_cache", "results", "*.egg-info")
    shutil.copytree(ROOT, target, ignore=ignore, dirs_exist_ok=True)


def run(mutant: Mutant) -> tuple[str, str, float]:
    """(verdict, the first failing test or why, seconds) of one mutant in a temporary copy of the tree."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"dtp-mutant-{mutant.name}-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        source = tree / mutant.path
        text = source.read_text()
        assert text.count(mutant.old) == 1, f"{mutant.name}: {mutant.old!r} occurs {text.count(mutant.old)} times"
        source.write_text(text.replace(mutant.old, mutant.new))
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutant.tests]
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "killed", f"timed out after {TIMEOUT_S} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if done.returncode == 0:
        return "SURVIVED", "every covering test passed", seconds
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return "killed", (failed[0] if failed else done.stdout.strip().splitlines()[-1])[:140], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="mutant names")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    rows = ["| mutant | kind | file | covering tests | verdict | first failure | s |", "|---|---|---|---|---|---|---:|"]
    survivors = []
    for mutant in chosen:
        verdict, why, seconds = run(mutant)
        tests = ", ".join(Path(t).name for t in mutant.tests)
        rows.append(f"| {mutant.name} | {mutant.kind} | {mutant.path} | {tests} | {verdict} | {why} | {seconds:.0f} |")
        print(rows[-1], flush=True)
        survivors += [mutant.name] if verdict == "SURVIVED" else []
    command = f"nice python benchmarks/mutants.py {' '.join(sys.argv[1:])}".strip()
    summary = (
        f"{len(chosen) - len(survivors)} of {len(chosen)} mutants killed; survived: {', '.join(survivors) or 'none'}"
    )
    text = "\n".join(["# Mutation check", "", f"`{command}`: {summary}.", "", *rows, ""])
    print(text)
    if not args.only:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
