"""Per-rank weight bytes / (pipeline bytes / tp) of whole pipelines: transformer only vs text encoders too.

Every component is built at full size on the meta device in bf16 and sharded on rank 0 of torch's
fake process group of `tp` ranks, as `dtp check` does for one model:

    before  the transformer sharded by its bundled plan, everything else whole (dtp on main)
    after   `dtp.parallelize_pipeline(..., pad=True)`: the text encoders sharded by their bundled plans
            as well, vision towers included; heads and widths tp does not divide zero-padded (exact:
            Qwen2.5-VL-7B at tp=8, 28 query heads in 4 groups of 7 -> 8 each, kv heads shared by 2
            ranks, vision MLP 3420 -> 3424)

The VAE stays whole in both (no plan). Configs are the released checkpoints' (config.json values
written out in `dtp/analysis/released.py`: no model hub here); each measurement is `dtp check PIPELINE`'s
(`dtp.analysis.check.check_pipeline`). Each text encoder gets the first of its bundled plans that fits
the degree (CLIP-L at tp=8: clip-mlp); one whose plans do not fit stays whole, and the table says why.

    python benchmarks/pipeline_memory.py      # prints the table, writes benchmarks/results/pipeline_memory.md
"""

from __future__ import annotations

import time

from report import write_report

from dtp.analysis.check import check_pipeline
from dtp.analysis.released import RELEASED_PIPELINES

DEGREES = (2, 4, 8)


def measure(pipeline: str, tp: int, text_encoders: bool) -> dict:
    """{component: (whole bytes, this rank's bytes, plan or note)} on rank 0 of a fake group of `tp` ranks.

    `dtp check PIPELINE --tp N --pad` (`--whole-text-encoders` without --pad when `text_encoders` is False): text
    encoders whose plans do not fit `tp` stay whole, the PlanError's first reason the note.
    """
    report = check_pipeline(pipeline, tp=tp, whole_text_encoders=not text_encoders, pad=text_encoders)
    return {
        c["name"]: (c["total_bytes"], c["per_rank_bytes"], c["plan"] or _note(c, text_encoders))
        for c in report["components"]
    }


def _note(component: dict, text_encoders: bool) -> str:
    if not (text_encoders and component["name"].startswith("text_encoder")):
        return "whole"
    return "whole: " + component["whole_reason"].split(": ", 2)[-1].split(";")[0]  # the first number tp does not divide


def ratio(components: dict, tp: int) -> float:
    whole = sum(w for w, _, _ in components.values())
    local = sum(loc for _, loc, _ in components.values())
    return local / (whole / tp)


def tables() -> list[str]:
    summary = ["| pipeline | total (bf16) | " + " | ".join(f"tp={tp} before | tp={tp} after" for tp in DEGREES) + " |"]
    summary.append("|" + "---|" * (2 + 2 * len(DEGREES)))
    details = ["| pipeline | tp | component | class | whole GB | per rank before GB | per rank after GB | plan after |"]
    details.append("|---|---|---|---|---|---|---|---|")
    for pipeline, released in RELEASED_PIPELINES.items():
        cells, total = [], 0
        for tp in DEGREES:
            before, after = measure(pipeline, tp, False), measure(pipeline, tp, True)
            total = sum(w for w, _, _ in after.values())
            cells += [f"{ratio(before, tp):.4f}", f"{ratio(after, tp):.4f}"]
            for name, (whole, local, plan) in after.items():
                class_name = released.components[name].class_name
                details.append(
                    f"| {released.title} | {tp} | {name} | {class_name} | {whole / 1e9:.3f} | "
                    f"{before[name][1] / 1e9:.3f} | {local / 1e9:.3f} | {plan} |"
                )
        summary.append(f"| {released.title} | {total / 1e9:.2f} GB | " + " | ".join(cells) + " |")
    return summary + ["", "Per component:", ""] + details


def main() -> None:
    start = time.perf_counter()
    rows = tables()
    write_report(
        "pipeline_memory",
        [
            "# Whole pipelines: per-rank weights / (pipeline weights / tp)",
            "",
            "Command: `python benchmarks/pipeline_memory.py` (meta device + torch's fake process group, bf16,",
            "released configs). before: only the transformer sharded (its bundled plan), text encoders and VAE",
            "whole on every rank. after: `dtp.parallelize_pipeline(..., pad=True)`, text encoders (vision towers",
            "included) sharded by their bundled plans; what tp does not divide is zero-padded (exact): Qwen2.5-VL-7B",
            "at tp=8 pads each group of 7 query heads to 8 and shares each of its 4 kv heads between 2 ranks,",
            "CLIP-L's 12 heads pad to 16. The VAE stays whole. 1.000 is the physical limit.",
            "",
            *rows,
        ],
        start,
    )


if __name__ == "__main__":
    main()
