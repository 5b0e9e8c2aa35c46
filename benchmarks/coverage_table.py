"""The coverage table: every transformer class of the installed diffusers, with its bundled plan's full-size figures
and its measured tiny-model parity.

Full-size figures come from `dtp check` (`dtp.analysis.check.check`, meta device + torch's fake process group,
bf16, full-size configs = class defaults + each family's RELEASED, dtp/families/), so they cannot drift from what
the tool reports; the ratio is taken at tp = 8, or at the largest valid degree below 8. Parity: each family's tiny
model (dtp/families/), batch 2, sharded by its bundled plan on 2 gloo processes (tp=2), against the same model in
one process: max |sharded - ref| / max |ref|, the larger of the two ranks.

    python benchmarks/coverage_table.py              # prints the table, writes benchmarks/results/coverage.md
    python benchmarks/coverage_table.py --no-parity  # full-size figures only (no processes spawned)
    python benchmarks/coverage_table.py --only Kandinsky6Transformer3DModel   # these rows anew, the rest kept from
                                                                              # the results file (a full run: ~15 min)
"""

from __future__ import annotations

import argparse
import inspect
import time
from functools import partial

import diffusers
from report import RESULTS, write_report

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


def parity_worker(rank, world_size, classes=None):
    """This rank's relative error for every family's tiny model (or those of `classes`) under its bundled plan at
    tp = world_size."""
    from dtp.testing.parity import forward_parity
    from dtp.testing.tiny import tiny_inputs, tiny_model

    mesh = dtp.make_mesh(tp=world_size)
    return {
        cls: forward_parity(partial(tiny_model, cls), tiny_inputs(cls, batch=2), mesh, load_plan(f.plan)).relative
        for cls, f in FAMILIES.items()
        if classes is None or cls in classes
    }


def measured_parity(classes=None) -> dict[str, float]:
    from dtp.testing.launch import spawn

    ranks = spawn(parity_worker, 2, classes)
    return {cls: max(r[cls] for r in ranks) for cls in ranks[0]}


def kept_rows() -> tuple[dict[str, str], list[str]]:
    """The rows of the last results file by class, and its closing notes (the wall times of the runs that made
    them): `--only` writes the other rows back as they were, and says which rows it recomputed."""
    lines = (RESULTS / "coverage.md").read_text().splitlines()
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and " | " in line}
    last_row = max(i for i, line in enumerate(lines) if line.startswith("|"))
    return rows, lines[last_row + 1 :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-parity", action="store_true", help="skip the tp=2 parity runs")
    parser.add_argument("--only", nargs="+", metavar="CLASS", help="recompute these rows, keep the others")
    args = parser.parse_args()
    start = time.perf_counter()
    parity = {} if args.no_parity else measured_parity(args.only)
    classes = transformer_classes()
    kept, notes = kept_rows() if args.only else ({}, [])
    rows = []
    for cls in classes:
        if cls in kept and cls not in args.only:
            rows.append(kept[cls])
        elif cls in FAMILIES:
            rows.append("| " + " | ".join(planned_row(cls, parity)) + " |")
        else:
            rows.append(f"| {cls} | no bundled plan | | | | | |")
    planned = sum(cls in FAMILIES for cls in classes)
    write_report(
        "coverage",
        [
            f"# Coverage: {planned} of {len(classes)} transformer classes of diffusers {diffusers.__version__}",
            "",
            "Command: `python benchmarks/coverage_table.py` (full-size figures: `dtp check NAME --tp N --no-forward`).",
            "Valid TP: every degree that divides all widths, packed blocks, heads and kv heads at full size.",
            "Per-rank / ideal: per-rank weight bytes / (total / tp); 1.000 is the limit.",
            "Parity: tiny model, batch 2, bundled plan, tp=2 on 2 gloo processes: max |sharded - ref| / max |ref|.",
            "The list holds every model class under diffusers.models.transformers, audio and non-DiT ones included.",
            "",
            "| class | plan | params | valid TP (full size) | per-rank / ideal | CP modes | parity tp=2 |",
            "|---|---|---|---|---|---|---|",
            *rows,
            *notes,
            *([f"Rows recomputed with `--only {' '.join(args.only)}`:"] if args.only else []),
        ],
        start,
    )


if __name__ == "__main__":
    main()
