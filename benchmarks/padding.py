"""What pad=True costs at full size: per-rank weights and FLOPs of zero-padded heads and widths.

Full-size default configs, bf16, on the meta device and torch's fake process group, exactly as
`dtp check --pad` does (see `dtp.resolve.transforms.padding.overhead` for the columns' definitions):

- ratio: per-rank weight bytes / (unpadded total / tp), padding included (1.000 is the limit);
- padded / rank: the zero elements this rank stores (bytes);
- Linear FLOPs, attention FLOPs: padded / unpadded per token (Linears) and per seq^2 (attention).

Z-Image (30 heads) at the GPU counts its heads exclude (3, 4, 6, 7, 8), and the other bundled plans
at degrees their head counts do not divide. SD3.5-Large (38 heads) joins once it has a plan.

    python benchmarks/padding.py     # prints the table, writes benchmarks/results/padding.md
"""

from __future__ import annotations

import time

from report import write_report

from dtp.analysis.check import measure
from dtp.plan import load_plan
from dtp.testing.tiny import PLAN_CLASSES

CASES = {
    "zimage": (3, 4, 6, 7, 8),
    "flux": (3, 5, 6, 7),  # 24 heads
    "qwenimage": (5, 7),  # 24 heads
    "flux2": (5, 7),  # 48 heads
}


def row(plan_name: str, tp: int) -> str:
    report = measure(PLAN_CLASSES[plan_name], load_plan(plan_name), tp=tp, forward=False, pad=True)
    p = report["padding"]
    return (
        f"| {plan_name} | {tp} | {', '.join(p['heads']) or '-'} | {report['ratio']:.3f} | "
        f"{report['per_rank_bytes'] / 1e9:.2f} GB | {p['padded_bytes_per_rank'] / 1e6:.1f} MB | "
        f"x{p['linear_flops_ratio']:.4f} | x{p['attention_flops_ratio']:.4f} |"
    )


def main() -> None:
    start = time.perf_counter()
    rows = [
        "| plan | tp | heads | ratio | per rank | padded / rank | Linear FLOPs | attention FLOPs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows += [row(plan_name, tp) for plan_name, degrees in CASES.items() for tp in degrees]
    write_report(
        "padding",
        [
            "# pad=True: padding overhead at full size",
            "",
            "Command: `python benchmarks/padding.py` (meta device + torch's fake process group, bf16, full-size",
            "default configs, as `dtp check --pad`). ratio = per-rank weight bytes / (unpadded total / tp),",
            "padding included; FLOPs columns are padded / unpadded (Linears per token, attention per seq^2).",
            "",
            *rows,
        ],
        start,
    )


if __name__ == "__main__":
    main()
