"""One writer for every benchmark's result file: print the report, stamp the wall time, write results/<name>.md.

    from report import table, write_report
    write_report("coverage", ["# Title", "", *table(["plan", "tp"], rows)], start)

Benchmarks are scripts run as `python benchmarks/<name>.py`, so this module is imported by its bare name.
"""

from __future__ import annotations

import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table: the header, its rule (numbers right-aligned by the caller's strings), the rows."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def write_report(name: str, lines: list[str], start: float | None = None) -> Path:
    """Print `lines` (plus the wall time since `start`) and write them to `benchmarks/results/<name>.md`."""
    if start is not None:
        lines = [*lines, "", f"Wall time of the script: {time.perf_counter() - start:.1f} s."]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text + "\n")
    return path
