"""Per-rank weight bytes of quantized full-size DiTs at tp=8 (`dtp check --quant`), against quantized total / 8.

Each model is built at full size on the meta device, every Linear quantized by torchao (int8 or float8
weight-only, per-row scales: data + scales counted), sharded with its bundled plan on rank 0 of a fake
process group of 8, and its parameters' local bytes summed (`dtp.analysis.check.check`). The bound the
issue sets: per rank <= 1.05 x (quantized total / 8).

    python benchmarks/quant_bytes.py     # prints the table, writes benchmarks/results/quant_bytes.md
"""

from __future__ import annotations

import time
from pathlib import Path

from dtp.analysis.check import check

RESULTS = Path(__file__).resolve().parent / "results" / "quant_bytes.md"
MODELS = ("flux", "flux2", "qwenimage")
SCHEMES = ("int8wo", "fp8wo")
TP = 8
BOUND = 1.05


def row(name: str, scheme: str | None) -> str:
    r = check(name, tp=TP, forward=False, quant=scheme)
    ok = "yes" if r["ratio"] <= BOUND else "NO"
    return (
        f"| {r['model']} | {scheme or 'bf16'} | {r['total_bytes'] / 1e9:.3f} | {r['per_rank_bytes'] / 1e9:.3f} | "
        f"{r['ideal_bytes'] / 1e9:.3f} | {r['ratio']:.3f} | {ok if scheme else '-'} |"
    )


def main() -> None:
    start = time.perf_counter()
    header = [
        f"# Quantized weights at tp={TP}: per-rank bytes vs quantized total / {TP}",
        "",
        "`dtp check MODEL --tp 8 --quant SCHEME` (meta device, fake process group, bf16 before quantization;",
        f"every Linear quantized by torchao; bytes = data + scales). Bound: ratio <= {BOUND}.",
        "",
        "| model | scheme | total GB | per rank GB | total / 8 GB | ratio | within bound |",
        "|---|---|---:|---:|---:|---:|:-:|",
    ]
    rows = []
    for name in MODELS:
        for scheme in (None, *SCHEMES):
            rows.append(row(name, scheme))
            print(rows[-1], flush=True)
    text = "\n".join([*header, *rows, "", f"({time.perf_counter() - start:.0f} s)", ""])
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
