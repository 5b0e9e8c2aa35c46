"""Per-rank activation peak of one full-size transformer forward at 8 ranks, every bundled DiT plan.

For each plan: the peak of one forward on one rank (cp=1, tp=1) and on rank 0 at (cp, tp) = (8, 1), (4, 2),
(2, 4), (1, 8), each as `dtp check PLAN --cp C --tp T` reports it (`dtp/analysis/forward.py`: built at
full size on the meta device, one block per stack, sharded and CP-split by its plan in a fake process
group of 8, run in bf16 on fake tensors under `PhaseTrace`), and ratio = per rank / (one rank / 8).
A mesh the plan refuses says why (its PlanError / ForwardError, shortened).

Inputs, batch 1: image models 1024 x 1024 px (4096 image tokens, 1024 for the 32x-VAE models) and 512
text tokens; video models their usual clip (`each family's `GEOMETRY.clip``, e.g. Wan 81 frames of 480 x 832).
Then the issue's check: best mesh per model <= 1.25 x (one rank / 8) for Wan 2.1 14B at 480p x 81,
HunyuanVideo at 720p x 129 and FLUX.1-dev at 2048 x 2048.

    python benchmarks/cp_peaks.py [--cp-mode ulysses|ring] [--plans wan flux ...]

Prints the table and writes benchmarks/results/cp_peaks.md (CPU seconds per plan in the last column).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dtp.analysis.forward import forward_peak, peak_report
from dtp.analysis.inputs import ForwardShape
from dtp.errors import ForwardError, PlanError
from dtp.families import FAMILIES
from dtp.plan import bundled_plan_names, load_plan

RESULTS = Path(__file__).resolve().parent / "results" / "cp_peaks.md"
MESHES = ((8, 1), (4, 2), (2, 4), (1, 8))  # (cp, tp)
BOUND = 1.25
# diffusers' Cosmos forward resizes its padding mask with torchvision (not installed here): traced without it
# (16 instead of 17 input channels of the patch embedding; nothing else changes).
CONFIGS = {"CosmosTransformer3DModel": {"concat_padding_mask": False}}
CP8 = ("cogview4", "pixart", "qwenimage", "cosmos")  # issue 35: each at cp=8 <= BOUND x ideal (default shapes)
DONE_WHEN = (  # (plan, shape) of the check
    ("wan", ForwardShape(resolution=480, frames=81)),
    ("hunyuanvideo", ForwardShape(resolution=720, frames=129)),
    ("flux", ForwardShape(resolution=2048)),
)


def dit_plans() -> list[tuple[str, str]]:
    """(plan name, class name) of every bundled plan written for a DiT family."""
    plans = ((name, load_plan(name)) for name in bundled_plan_names())
    return [(name, plan.models[0]) for name, plan in plans if plan.models and plan.models[0] in FAMILIES]


def measure(name: str, class_name: str, shape: ForwardShape, cp_mode: str) -> tuple[str, list, object]:
    """(input, [report or why not per mesh], one rank's ForwardPeak) for one plan at `shape`."""
    plan = load_plan(name)
    config = CONFIGS.get(class_name)
    one = forward_peak(class_name, plan, shape=shape, config=config)
    cells = []
    for cp, tp in MESHES:
        common = dict(cp=cp, tp=tp, shape=shape, one=one, config=config)
        try:
            cells.append(peak_report(class_name, plan, cp_mode=cp_mode, **common))
        except (PlanError, ForwardError) as exc:
            if cp == 1 or cp_mode == "ring":
                cells.append(_why(exc))
                continue
            try:  # a Ulysses head constraint: ring attention has none
                cells.append({**peak_report(class_name, plan, cp_mode="ring", **common), "note": "ring"})
            except (PlanError, ForwardError) as ring_exc:
                cells.append(_why(ring_exc))
        except Exception as exc:  # noqa: BLE001 - e.g. a check that reads tensor values, which fake tensors lack
            cells.append(f"not measured: {type(exc).__name__} {str(exc)[:60]}")
    return one.input, cells, one


def _why(exc: Exception) -> str:
    text = str(exc).replace("|", "/").replace("\n", " ")
    text = text.split(": ", 1)[1] if text.startswith("plan ") else text
    return f"refused: {text[:90]}{'...' if len(text) > 90 else ''}"


def _cell(cell) -> str:
    if isinstance(cell, str):
        return cell
    note = f" {cell['note']}" if "note" in cell else ""
    return f"{cell['per_rank_bytes'] / 1e9:.3f} GB ({cell['ratio']:.2f}){note}"


def table_rows(plans: list[tuple[str, str]], cp_mode: str, cp8: dict) -> list[str]:
    """One row per plan; `cp8` receives the (cp=8, tp=1) cell of the plans in `CP8`."""
    rows = []
    for name, class_name in plans:
        start = time.process_time()
        try:
            described, cells, one = measure(name, class_name, ForwardShape(), cp_mode)
        except Exception as exc:  # noqa: BLE001 - a forward that cannot run on fake tensors is reported, not fatal
            rows.append(f"| {name} | {class_name} | - | - | {_why(exc)} | | | | |")
            print(rows[-1], flush=True)
            continue
        seconds = time.process_time() - start
        if name in CP8:
            cp8[name] = (described, cells[0])
        row = [name, class_name, described, f"{one.peak_bytes / 1e9:.3f} GB", *map(_cell, cells), f"{seconds:.0f}"]
        rows.append("| " + " | ".join(row) + " |")
        print(rows[-1], flush=True)
    return rows


def done_when_rows(cp_mode: str) -> list[str]:
    rows = []
    for name, shape in DONE_WHEN:
        class_name = load_plan(name).models[0]
        described, cells, one = measure(name, class_name, shape, cp_mode)
        ran = [(c["ratio"], (c["cp"], c["tp"]), c) for c in cells if not isinstance(c, str)]
        ratio, mesh, best = min(ran, key=lambda r: r[0])
        ok = "yes" if ratio <= BOUND else "NO"
        rows.append(
            f"| {name} | {described} | {one.peak_bytes / 1e9:.3f} GB | {mesh} | "
            f"{best['per_rank_bytes'] / 1e9:.3f} GB | {best['ideal_bytes'] / 1e9:.3f} GB | {ratio:.3f} | {ok} |"
        )
        print(rows[-1], flush=True)
    return rows


def cp8_rows(cp8: dict) -> list[str]:
    rows = []
    for name in CP8:
        if name not in cp8:
            continue
        described, cell = cp8[name]
        if isinstance(cell, str):
            rows.append(f"| {name} | {described} | {cell} | | | NO |")
            continue
        ok = "yes" if cell["ratio"] <= BOUND else "NO"
        per_rank, ideal = cell["per_rank_bytes"] / 1e9, cell["ideal_bytes"] / 1e9
        rows.append(f"| {name} | {described} | {per_rank:.3f} GB | {ideal:.3f} GB | {cell['ratio']:.3f} | {ok} |")
    return rows


def replace_rows(path: Path, rows: list[str]) -> None:
    """Put `rows` in place of the rows of the same plans in the result file: a run with `--plans`."""

    def key(line: str) -> str:
        return " | ".join(line.split(" | ")[:2])  # plan and class (table) or plan and input (the issue sections)

    new = {key(row): row for row in rows}
    lines = [new.get(key(line), line) for line in path.read_text().splitlines()]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp-mode", choices=("ulysses", "ring"), default="ulysses")
    parser.add_argument("--plans", nargs="*", help="plan names (default: every bundled DiT plan)")
    parser.add_argument("--skip-done-when", action="store_true", help="only the table of every plan")
    args = parser.parse_args()
    plans = [p for p in dit_plans() if not args.plans or p[0] in args.plans]
    start = time.perf_counter()
    cpu = time.process_time()
    meshes = " | ".join(f"cp={cp} tp={tp}" for cp, tp in MESHES)
    text = [
        f"# Activation peak of one full-size forward per rank at 8 ranks ({args.cp_mode})",
        "",
        "`dtp check PLAN --cp C --tp T` (dtp/analysis/forward.py): bf16, batch 1, fake tensors, the real plan and",
        "CP split, one block per stack traced. Cells: per-rank peak (ratio to one rank / 8); `ring`: Ulysses",
        "refused the mesh (heads), ring attention measured instead. Cosmos: traced with concat_padding_mask off.",
        "Images 1024 x 1024 px + 512 text tokens; videos their usual clip.",
        "",
        f"| plan | class | input | one rank | {meshes} | CPU s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
        *table_rows(plans, args.cp_mode, cp8 := {}),
    ]
    text += [
        "",
        f"## Issue 35's check: cp=8 (tp=1) per rank <= {BOUND} x (one rank / 8)",
        "",
        "| plan | input | per rank | one rank / 8 | ratio | within |",
        "|---|---|---:|---:|---:|:-:|",
        *cp8_rows(cp8),
    ]
    if not args.skip_done_when:
        text += [
            "",
            f"## Issue 21's check: best mesh at 8 ranks, per rank <= {BOUND} x (one rank / 8)",
            "",
            "| plan | input | one rank | best (cp, tp) | per rank | one rank / 8 | ratio | within |",
            "|---|---|---:|---|---:|---:|---:|:-:|",
            *done_when_rows(args.cp_mode),
        ]
    text += ["", f"({time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu:.0f} s CPU)", ""]
    out = RESULTS if args.cp_mode == "ulysses" else RESULTS.with_name("cp_peaks_ring.md")
    if not args.plans:
        out.write_text("\n".join(text))
    elif out.exists():  # the named plans' rows replace theirs; the issue sections keep their other rows
        replace_rows(out, [line for line in text if line.startswith("| ") and not line.startswith("| plan ")])
    print("\n".join(text))


if __name__ == "__main__":
    main()
