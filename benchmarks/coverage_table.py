"""The coverage table: every bundled plan, its valid TP degrees at full size, per-rank / ideal weights.

Generated from `dtp check` (`dtp.analysis.check.check`, meta device + torch's fake process group, bf16,
full-size configs = class defaults + `each family's RELEASED (dtp/families/)`), so it cannot drift
from what the tool reports. The ratio is taken at tp = 8, or at the largest valid degree below 8.

    python benchmarks/coverage_table.py      # prints the table, writes benchmarks/results/coverage.md
"""

from __future__ import annotations

import time

from report import write_report

from dtp.analysis.check import check
from dtp.plan import bundled_plan_names, load_plan

MAX_TP = 8


def row(name: str) -> str:
    plan = load_plan(name)
    base = check(name, tp=1, forward=False)
    degrees = base["candidates"]
    tp = max(t for t in degrees if t <= MAX_TP)
    report = check(name, tp=tp, forward=False)
    cp = "ulysses, ring" if plan.cp is not None else "none (reason in the plan header)"
    if plan.cp is not None and plan.cp.refused:
        cp = "refused (reason in the plan header)"
    return (
        f"| {', '.join(plan.models)} | plans/{name}.yaml | {report['params'] / 1e9:.2f} B | "
        f"{', '.join(map(str, degrees))} | {report['ratio']:.3f} at tp={tp} | {cp} |"
    )


def main() -> None:
    start = time.perf_counter()
    names = bundled_plan_names()
    rows = [row(name) for name in names]
    write_report(
        "coverage",
        [
            f"# Bundled plans: {len(names)} architectures",
            "",
            "Command: `python benchmarks/coverage_table.py` (the figures of `dtp check NAME --tp N --no-forward`).",
            "Valid TP: every degree that divides all widths, packed blocks, heads and kv heads at full size.",
            "Per-rank / ideal: per-rank weight bytes / (total / tp); 1.000 is the limit.",
            "",
            "| class | plan | params | valid TP (full size) | per-rank / ideal | CP modes |",
            "|---|---|---|---|---|---|",
            *rows,
        ],
        start,
    )


if __name__ == "__main__":
    main()
