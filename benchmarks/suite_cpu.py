"""CPU seconds of the test suite per module, from a `DTP_CPU_LOG` file.

    DTP_CPU_LOG=/tmp/cpu.jsonl python -m pytest -q -n 2 --dist loadfile tests
    python benchmarks/suite_cpu.py /tmp/cpu.jsonl [--top 40] [--before OLD.jsonl]

tests/conftest.py writes one line per test (its wall, this process's CPU, its waited children's: servers, torchrun);
`dtp.analysis.launch` one per spawned rank (forked by the forkserver, so no pytest process's rusage sees it). CPU
seconds are what the machine's load moves least: compare two runs back to back. Prints a table and writes
benchmarks/results/suite_cpu.md.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

RESULT = Path(__file__).resolve().parent / "results" / "suite_cpu.md"
FIELDS = ("total", "self", "children", "ranks", "wall")


def per_module(path: str) -> dict[str, collections.Counter]:
    """{module: Counter(total, self, children, ranks, wall, tests, rank_count)} from one log."""
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in Path(path).read_text().splitlines():
        entry = json.loads(line)
        row = rows[entry["test"].split("::")[0]]
        if "rank_cpu" in entry:
            row["ranks"] += entry["rank_cpu"]
            row["rank_count"] += 1
        else:
            row["self"] += entry["cpu"]
            row["children"] += entry["children_cpu"]
            row["wall"] += entry["wall"]
            row["tests"] += 1
        row["total"] = row["self"] + row["children"] + row["ranks"]
    return rows


def table(rows: dict, top: int, before: dict | None) -> str:
    head = "| module | " + " | ".join(FIELDS) + (" | total before |" if before else " |")
    lines = [head, "|---|" + "---:|" * (len(FIELDS) + bool(before))]
    ordered = sorted(rows.items(), key=lambda item: -item[1]["total"])
    for module, row in ordered[:top]:
        cells = [f"{row[f]:.1f}" for f in FIELDS] + ([f"{before[module]['total']:.1f}"] if before else [])
        lines.append(f"| {module} | " + " | ".join(cells) + " |")
    sums = [f"{sum(r[f] for r in rows.values()):.0f}" for f in FIELDS]
    sums += [f"{sum(r['total'] for r in before.values()):.0f}"] if before else []
    lines.append("| **all modules** | " + " | ".join(sums) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="a DTP_CPU_LOG file")
    parser.add_argument("--top", type=int, default=40, help="modules to list, costliest first")
    parser.add_argument("--before", default=None, help="an earlier log: its total per module beside")
    args = parser.parse_args(argv)
    before = per_module(args.before) if args.before else None
    text = table(per_module(args.log), args.top, before)
    print(text)
    RESULT.write_text(f"# Suite CPU seconds per module\n\n`python benchmarks/suite_cpu.py {args.log}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
