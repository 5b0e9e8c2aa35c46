"""Per-rank LoRA adapter bytes after `dtp.load_lora`, full-size FLUX.1-dev / FLUX.2-dev / Qwen-Image, tp 2 / 4 / 8.

A rank-16 bf16 LoRA on every nn.Linear of the transformer (sharded, packed, gathered and replicated
ones), loaded with `dtp.load_lora` into the bundled plan's sharding on rank 0 of torch's fake
process group, models and LoRA on the meta device (shapes only, nothing allocated): the bytes are
those `LoraStats` reports, i.e. what the loader's log line says on a real run.

The split factor of each sharded base (B of colwise kinds, A of rowwise kinds) costs 1/tp per
rank; the other factor (rank x width, whole on every rank) and the adapters of replicated Linears
do not shrink, so per-rank bytes approach (whole factors) rather than total / tp.

    python benchmarks/lora_bytes.py            # prints the table, writes benchmarks/results/lora_bytes.md
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import torch
from torch import nn

import dtp
from dtp.tools.fakepg import default_config, fake_world, meta_model

DEGREES = (2, 4, 8)
LORA_RANK = 16
MODELS = {
    "flux (FLUX.1-dev)": "FluxTransformer2DModel",
    "flux2 (FLUX.2-dev)": "Flux2Transformer2DModel",
    "qwenimage (Qwen-Image)": "QwenImageTransformer2DModel",
}
RESULTS = Path(__file__).resolve().parent / "results" / "lora_bytes.md"


def meta_lora(model: nn.Module, rank: int = LORA_RANK) -> dict[str, torch.Tensor]:
    """A rank-`rank` LoRA on every nn.Linear, diffusers' key format, meta tensors in bf16."""
    lora = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            kw = dict(device="meta", dtype=torch.bfloat16)
            lora[f"transformer.{path}.lora_A.weight"] = torch.empty(rank, module.in_features, **kw)
            lora[f"transformer.{path}.lora_B.weight"] = torch.empty(module.out_features, rank, **kw)
    return lora


def measure(class_name: str, tp: int) -> dtp.adapters.LoraStats:
    with fake_world(tp):
        model = meta_model(class_name, default_config(class_name), dtype=torch.bfloat16)
        mesh = dtp.make_mesh(tp=tp, device_type="cpu")
        dtp.parallelize(model, mesh)
        return dtp.load_lora(model, meta_lora(model), adapter_name="bench")


def table() -> list[str]:
    rows = [
        "| model | adapted Linears (sharded) | adapter (bf16) | "
        + " | ".join(f"tp={tp}: per rank (x full, x full/tp)" for tp in DEGREES)
        + " |",
        "|---|---|---|" + "---|" * len(DEGREES),
    ]
    for label, class_name in MODELS.items():
        cells, stats = [], None
        for tp in DEGREES:
            stats = measure(class_name, tp)
            share = stats.local_bytes / stats.full_bytes
            cells.append(f"{stats.local_bytes / 1e6:.1f} MB ({share:.3f}, {share * tp:.2f})")
        rows.append(
            f"| {label} | {stats.modules} ({stats.sharded_modules}) | {stats.full_bytes / 1e6:.1f} MB | "
            + " | ".join(cells)
            + " |"
        )
    return rows


def main() -> None:
    logging.getLogger("dtp").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    rows = table()
    text = "\n".join(
        [
            "# Per-rank LoRA adapter bytes (benchmarks/lora_bytes.py)",
            "",
            f"Rank-{LORA_RANK} bf16 LoRA on every nn.Linear, bundled plans, full-size default configs, meta device "
            "+ fake process group (rank 0). 'x full' = per-rank / whole adapter; 'x full/tp' = per-rank / (whole / tp).",
            "",
            *rows,
            "",
            f"Measured in {time.perf_counter() - start:.0f} s with torch {torch.__version__}.",
        ]
    )
    print(text)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text + "\n")


if __name__ == "__main__":
    main()
