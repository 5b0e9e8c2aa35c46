"""The coverage table: every transformer class of the installed diffusers, with its bundled plan's full-size figures
and its measured tiny-model parity.

Full-size figures come from `dtp check` (`dtp.analysis.check.check`, meta device + torch's fake process group,
bf16, full-size configs = class defaults + each family's RELEASED, dtp/families/), so they cannot drift from what
the tool reports; the ratio is taken at tp = 8, or at the largest valid degree below 8. Parity: each family's tiny
model (dtp/families/), batch 2, sharded by its bundled plan on 2 gloo processes (tp=2), against the same model in
one process: max |sharded - ref| / max |ref|, the larger of the two ranks.

    python benchmarks/coverage_table.py              # prints the table, writes benchmarks/results/coverage.md
    python benchmarks/coverage_table.py --no-parity  # full-size figures only (no processes spawned)
    python benchmarks/coverage_table.py --only Flux3Transformer2DModel ...  # re-measure these rows in place
"""

from __future__ import annotations

import argparse
import inspect
import time
from functools import partial

import diffusers
from report import write_report

import dtp
from dtp.analysis.check import check
from dtp.families import FAMILIES
from dtp.plan import load_plan

MAX_TP = 8


def transformer_classes() -> list[str]:
    """Every model class diffusers exports from `diffusers.models.transformers` (DiTs, audio and others)."""
    names = []
    for name in dir(diffusers):
        obj = getattr(diffusers, name, None)
        module = getattr(obj, "__module__", "") if inspect.isclass(obj) else ""
        if module.startswith("diffusers.models.transformers.") and issubclass(obj, diffusers.ModelMixin):
            names.append(name)
    return sorted(names)


def cp_status(plan) -> str:
    if plan.cp is None:
        return "none (reason in the plan header)"
    if plan.cp.refused:
        return "refused (reason in the plan header)"
    return "ulysses (ring refused: reason in the plan)" if plan.cp.ring_refused else "ulysses, ring"


def planned_row(class_name: str, parity: dict) -> list[str]:
    name = FAMILIES[class_name].plan
    plan = load_plan(name)
    degrees = check(name, tp=1, forward=False)["candidates"]
    tp = max(t for t in degrees if t <= MAX_TP)
    report = check(name, tp=tp, forward=False)
    measured = f"{parity[class_name]:.1e}" if class_name in parity else "not run"
    return [
        class_name,
        f"plans/{name}.yaml",
        f"{report['params'] / 1e9:.2f} B",
        ", ".join(map(str, degrees)),
        f"{report['ratio']:.3f} at tp={tp}",
        cp_status(plan),
        measured,
    ]


def parity_worker(rank, world_size, only=None):
    """This rank's relative error for every family's tiny model (or those in `only`) under its bundled plan at
    tp = world_size."""
    from dtp.testing.parity import forward_parity
    from dtp.testing.tiny import tiny_inputs, tiny_model

    mesh = dtp.make_mesh(tp=world_size)
    return {
        cls: forward_parity(partial(tiny_model, cls), tiny_inputs(cls, batch=2), mesh, load_plan(f.plan)).relative
        for cls, f in FAMILIES.items()
        if only is None or cls in only
    }


def measured_parity(only=None) -> dict[str, float]:
    from dtp.testing.launch import spawn

    ranks = spawn(parity_worker, 2, only)
    return {cls: max(r[cls] for r in ranks) for cls in ranks[0]}


def row(cls: str, parity: dict) -> str:
    if cls in FAMILIES:
        return "| " + " | ".join(planned_row(cls, parity)) + " |"
    return f"| {cls} | no bundled plan | | | | | |"


def header(planned: int, total: int) -> list[str]:
    return [
        f"# Coverage: {planned} of {total} transformer classes of diffusers {diffusers.__version__}",
        "",
        "Command: `python benchmarks/coverage_table.py` (full-size figures: `dtp check NAME --tp N --no-forward`).",
        "Valid TP: every degree that divides all widths, packed blocks, heads and kv heads at full size.",
        "Per-rank / ideal: per-rank weight bytes / (total / tp); 1.000 is the limit.",
        "Parity: tiny model, batch 2, bundled plan, tp=2 on 2 gloo processes: max |sharded - ref| / max |ref|.",
        "The list holds every model class under diffusers.models.transformers, audio and non-DiT ones included.",
        "",
        "| class | plan | params | valid TP (full size) | per-rank / ideal | CP modes | parity tp=2 |",
        "|---|---|---|---|---|---|---|",
    ]


def rows_in_place(only: list[str], parity: dict, classes: list[str]) -> list[str]:
    """The existing table with the rows of `only` re-measured (the others kept as the last full run wrote them)."""
    from report import RESULTS

    kept = {}
    for line in (RESULTS / "coverage.md").read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) == 7 and cells[0][2:] in classes:
            kept[cells[0][2:]] = line
    fresh = {cls: row(cls, parity) for cls in classes if cls in only or cls not in kept}
    for cls, line in fresh.items():  # --no-parity: a re-measured row keeps its last measured parity
        if cls in kept and line.endswith("| not run |"):
            fresh[cls] = line.rsplit(" | ", 1)[0] + " | " + kept[cls].rsplit(" | ", 1)[1]
    return [fresh.get(cls, kept.get(cls)) for cls in classes]


def earlier_notes() -> list[str]:
    """The lines below the table of the last written file (its run's wall time and earlier `--only` notes)."""
    from report import RESULTS

    lines = (RESULTS / "coverage.md").read_text().splitlines()
    last_row = max(i for i, line in enumerate(lines) if line.startswith("|"))
    return [line for line in lines[last_row + 1 :] if line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-parity", action="store_true", help="skip the tp=2 parity runs")
    parser.add_argument("--only", nargs="+", metavar="CLASS", help="re-measure these rows, keep the others")
    args = parser.parse_args()
    start = time.perf_counter()
    parity = {} if args.no_parity else measured_parity(args.only)
    classes = transformer_classes()
    rows = rows_in_place(args.only, parity, classes) if args.only else [row(cls, parity) for cls in classes]
    planned = sum(cls in FAMILIES for cls in classes)
    note = [*earlier_notes(), f"Rows re-measured by `--only`: {', '.join(args.only)}."] if args.only else []
    write_report("coverage", [*header(planned, len(classes)), *rows, "", *note], start)


if __name__ == "__main__":
    main()
