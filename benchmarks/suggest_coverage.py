"""dtp.suggest_plan on every class with a tiny config: is the plan exact, and how much does it shard?

For each class in `dtp.testing.tiny.TINY_CONFIGS` (no bundled plan consulted): the suggested plan at
tp=2, then `dtp.verify`'s site-by-site comparison on 2 gloo processes (one spawn for all classes):
- exact: every planned Linear's input and output, every attention output and the model output
  within 1e-5 relative of the single-process reference on both ranks;
- share: the weight bytes one rank holds / all weight bytes (0.50 is ideal at tp=2);
- rules: plan entries (globs count once); replicated: the YAML comments saying why, counted.
Usage:

    python benchmarks/suggest_coverage.py

Writes benchmarks/results/suggest_coverage.md.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import dtp
from dtp.analysis.suggest import rank_fraction, suggest
from dtp.analysis.verify import compare_sharded, merge
from dtp.testing.launch import spawn
from dtp.testing.tiny import TINY_CONFIGS, tiny_inputs, tiny_model

TP = 2
RESULT = Path(__file__).resolve().parent / "results" / "suggest_coverage.md"


def work(rank: int, world_size: int) -> dict:
    mesh = dtp.make_mesh(tp=world_size)
    out = {}
    for cls in TINY_CONFIGS:
        make = partial(tiny_model, cls)
        try:
            suggestion = suggest(make(), tiny_inputs(cls), tp=world_size)
        except dtp.PlanError as exc:
            out[cls] = {"refused": str(exc)}
            continue
        out[cls] = {
            "compare": compare_sharded(make, suggestion.plan, tiny_inputs(cls), mesh),
            "share": rank_fraction(make(), suggestion.plan, world_size),
            "rules": len(suggestion.plan.rules),
            "notes": len(suggestion.notes),
        }
    return out


def main() -> None:
    start = time.time()
    ranks = spawn(work, TP)
    rows = [
        f"dtp.suggest_plan at tp={TP}, tiny configs, verified on {TP} gloo processes ({time.time() - start:.0f} s)",
        "",
        "| class | exact (every site) | model output rel | share per rank | rules | replicated (why) |",
        "|---|---|---|---|---|---|",
    ]
    exact = sharded = 0
    for cls in TINY_CONFIGS:
        result = ranks[0][cls]
        if "refused" in result:
            rows.append(f"| {cls} | refused | - | 1.00 | 0 | {result['refused'][:80]} |")
            continue
        report = merge([r[cls]["compare"] for r in ranks], model=cls)
        exact += report.ok
        sharded += result["share"] <= 0.75
        rel = "error" if report.output_rel is None else f"{report.output_rel:.1e}"
        rows.append(
            f"| {cls} | {'yes' if report.ok else 'NO: ' + report.format().splitlines()[-1]} | {rel} | "
            f"{result['share']:.2f} | {result['rules']} | {result['notes']} |"
        )
    rows += ["", f"exact: {exact} of {len(TINY_CONFIGS)}; a rank holds <= 0.75 of the weights: {sharded}"]
    text = "\n".join(rows)
    print(text)
    RESULT.write_text(text + "\n")


if __name__ == "__main__":
    main()
