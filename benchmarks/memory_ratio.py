"""Per-rank weight bytes / (total / tp) of every bundled plan at tp 2 / 4 / 8, next to diffusers' own plan.

Full-size default configs (see `dtp.analysis.fakepg.default_config`; FLUX.1-dev = FluxTransformer2DModel
defaults with guidance_embeds=True), bf16, built on the meta device and sharded on rank 0 of torch's
fake process group, exactly as `dtp check` does. A second table gives the collectives of one forward
at 1024x1024 px (4096 image + 512 text tokens, batch 1) at tp=8 (or the largest valid degree below), to show what the
gathered modulation costs in communication.

    python benchmarks/memory_ratio.py            # prints the tables, writes benchmarks/results/memory_ratio.md
"""

from __future__ import annotations

import time

from report import write_report

from dtp.analysis.check import measure
from dtp.errors import PlanError
from dtp.plan import Plan, load_plan
from dtp.testing.tiny import PLAN_CLASSES, model_class

DEGREES = (2, 4, 8)


def ratio_cell(class_name: str, plan, tp: int) -> str:
    if plan is None:
        return "no plan"
    try:
        report = measure(class_name, plan, tp=tp, forward=False)
    except PlanError:
        return "unsupported"
    return f"{report['ratio']:.3f} ({report['per_rank_bytes'] / 1e9:.2f} GB)"


def diffusers_plan(class_name: str):
    tp_plan = getattr(model_class(class_name), "_tp_plan", None)
    return Plan.from_dict(tp_plan, name=f"{class_name}._tp_plan") if tp_plan else None


def memory_table() -> list[str]:
    header = (
        "| plan | model | total (bf16) | " + " | ".join(f"dtp tp={tp} | diffusers tp={tp}" for tp in DEGREES) + " |"
    )
    rows = [header, "|" + "---|" * (3 + 2 * len(DEGREES))]
    for plan_name, class_name in sorted(PLAN_CLASSES.items()):
        plan, peer = load_plan(plan_name), diffusers_plan(class_name)
        total = measure(class_name, plan, tp=1, forward=False)["total_bytes"]
        cells = [c for tp in DEGREES for c in (ratio_cell(class_name, plan, tp), ratio_cell(class_name, peer, tp))]
        rows.append(f"| {plan_name} | {class_name} | {total / 1e9:.2f} GB | " + " | ".join(cells) + " |")
    return rows


def collectives_table() -> list[str]:
    rows = [
        "| plan | tp | all_reduce (count, bytes) | all_gather (count, bytes) "
        "| diffusers all_reduce | diffusers all_gather |",
        "|---|---|---|---|---|---|",
    ]
    for plan_name, class_name in sorted(PLAN_CLASSES.items()):
        candidates = measure(class_name, load_plan(plan_name), tp=1, forward=False)["candidates"]
        tp = max(t for t in candidates if t <= 8)  # 8, or the largest valid degree below it
        ours = _ops(measure(class_name, load_plan(plan_name), tp=tp))
        peer_plan = diffusers_plan(class_name)
        peer = _ops(measure(class_name, peer_plan, tp=tp)) if peer_plan else {}
        rows.append(
            f"| {plan_name} | {tp} | {_cell(ours, 'all_reduce')} | {_cell(ours, 'all_gather_into_tensor')} | "
            f"{_cell(peer, 'all_reduce') if peer_plan else 'no plan'} | "
            f"{_cell(peer, 'all_gather_into_tensor') if peer_plan else 'no plan'} |"
        )
    return rows


def _ops(report: dict) -> dict:
    # None where the model's forward cannot run on the meta device (e.g. HiDream's MoE bincount).
    return report["collectives"]["measured"] or {}


def _cell(ops: dict, op: str) -> str:
    entry = ops.get(op)
    return f"{entry['count']}, {entry['bytes'] / 1e6:.1f} MB" if entry else "0"


def main() -> None:
    start = time.perf_counter()
    memory = memory_table()
    comms = collectives_table()
    write_report(
        "memory_ratio",
        [
            "# Per-rank weights / (total / tp): dtp's bundled plans vs diffusers' `_tp_plan`",
            "",
            "Command: `python benchmarks/memory_ratio.py` (meta device + torch's fake process group, bf16,",
            "full-size default configs; FLUX.1-dev = FluxTransformer2DModel defaults + guidance_embeds=True).",
            "Cell: ratio (per-rank GB). 1.000 is the physical limit; `unsupported`: the plan's head counts or",
            "dims do not divide by that tp; `no plan`: diffusers ships none for the class.",
            "",
            *memory,
            "",
            "## Collectives of one forward (1024x1024 px: 4096 image + 512 text tokens, batch 1, bf16)",
            "",
            "Bytes are the full result size of each collective, summed. The all-gathers are dtp's",
            "colwise_gathered modulation and embedder outputs.",
            "",
            *comms,
        ],
        start,
    )


if __name__ == "__main__":
    main()
