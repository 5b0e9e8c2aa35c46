"""Per-rank LoRA adapter bytes after `dtp.load_lora`, full-size FLUX.1-dev / FLUX.2-dev / Qwen-Image, tp 2 / 4 / 8.

A rank-16 bf16 LoRA on every nn.Linear of the transformer (sharded, packed, gathered and replicated
ones), loaded with `dtp.load_lora` into the bundled plan's sharding on rank 0 of torch's fake
process group, models and LoRA on the meta device (shapes only, nothing allocated): the bytes are
those `LoraStats` reports, i.e. what the loader's log line says on a real run.

The split factor of each sharded base (B of colwise kinds, A of rowwise kinds) costs 1/tp per
rank; the other factor (rank x width, whole on every rank) and the adapters of replicated Linears
do not shrink, so per-rank bytes approach (whole factors) rather than total / tp.

A second table counts the collectives of one forward (meta, fake process group) with and without
the LoRA: what the rowwise all-reduces and gathered all-gathers of the adapters cost.

    python benchmarks/lora_bytes.py            # prints the tables, writes benchmarks/results/lora_bytes.md
"""

from __future__ import annotations

import logging
import time
import warnings

import torch
from report import write_report
from torch import nn

import dtp
from dtp.analysis.collectives import CollectiveCounter
from dtp.analysis.fakepg import default_config, fake_world, meta_inputs, meta_model

DEGREES = (2, 4, 8)
COLLECTIVES_TP = 4
IMG_TOKENS, TXT_TOKENS = 4096, 512  # 1024 x 1024 px, batch 1
LORA_RANK = 16
MODELS = {
    "flux (FLUX.1-dev)": "FluxTransformer2DModel",
    "flux2 (FLUX.2-dev)": "Flux2Transformer2DModel",
    "qwenimage (Qwen-Image)": "QwenImageTransformer2DModel",
}


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


def collectives(class_name: str, tp: int, with_lora: bool) -> dict[str, tuple[int, int]]:
    """`{op: (count, bytes)}` of one meta forward, with or without the LoRA of `meta_lora`."""
    with fake_world(tp):
        model = meta_model(class_name, default_config(class_name), dtype=torch.bfloat16)
        dtp.parallelize(model, dtp.make_mesh(tp=tp, device_type="cpu"))
        if with_lora:
            dtp.load_lora(model, meta_lora(model), adapter_name="bench")
        inputs = meta_inputs(class_name, model.config, torch.bfloat16, img_tokens=IMG_TOKENS, txt_tokens=TXT_TOKENS)
        with torch.no_grad(), CollectiveCounter(model) as counter:
            model(**inputs)
    found: dict[str, tuple[int, int]] = {}
    for record in counter.records:
        count, size = found.get(record.op, (0, 0))
        found[record.op] = (count + 1, size + record.bytes)
    return found


def collectives_table() -> list[str]:
    ops = ("all_reduce", "all_gather_into_tensor")
    rows = [
        "| model | " + " | ".join(f"{op} without LoRA | {op} with LoRA" for op in ops) + " |",
        "|---|" + "---|" * (2 * len(ops)),
    ]
    for label, class_name in MODELS.items():
        without, with_lora = (
            collectives(class_name, COLLECTIVES_TP, False),
            collectives(class_name, COLLECTIVES_TP, True),
        )
        cells = [_ops_cell(found, op) for op in ops for found in (without, with_lora)]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def _ops_cell(found: dict, op: str) -> str:
    count, size = found.get(op, (0, 0))
    return f"{count}, {size / 1e6:.1f} MB"


def main() -> None:
    logging.getLogger("dtp").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    rows = table()
    ops_rows = collectives_table()
    write_report(
        "lora_bytes",
        [
            "# Per-rank LoRA adapter bytes (benchmarks/lora_bytes.py)",
            "",
            f"Rank-{LORA_RANK} bf16 LoRA on every nn.Linear, bundled plans, full-size default configs, meta device "
            "+ fake process group (rank 0). 'x full' = per-rank / whole adapter; "
            "'x full/tp' = per-rank / (whole / tp).",
            "",
            *rows,
            "",
            f"Collectives of one forward at tp={COLLECTIVES_TP}, {IMG_TOKENS} image + {TXT_TOKENS} text tokens "
            "(count, bytes of the results): the LoRA adds one rank-16 all-reduce per adapted rowwise Linear and "
            "one all-gather per adapted colwise_gathered Linear (the size of that Linear's own output).",
            "",
            *ops_rows,
        ],
        start,
    )


if __name__ == "__main__":
    main()
