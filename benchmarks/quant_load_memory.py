"""Per-rank host memory of shard-on-load with quantization: `dtp.from_pretrained(..., quantization_config=...)`.

The mid-size FLUX.1 checkpoint of `load_memory.py` (dim 1536, ~1.16 GB fp32, several files) loaded on
tp = 2 and 4 gloo processes with diffusers' `TorchAoConfig(Int8WeightOnlyConfig())` (and float8): each
rank reads its fp32 slices and quantizes each Linear weight as it arrives. Peak RSS increase (VmHWM
after the load minus VmRSS before it, peak reset via /proc/self/clear_refs) against the bound the
issue sets: 1.25 x the rank's quantized share (local data + scales + unquantized parameters) + 150 MB.
Each configuration runs with dtp's heap trim after every quantized weight (`dtp.quant.load.trim_heap`,
glibc malloc_trim) and, for comparison, without it (`--compare-trim`); `--dtypes fp32 bf16` loads the
fp32 checkpoint as it is or cast to bfloat16 slice by slice (the dtype real FLUX checkpoints have).
`--prequantized` loads instead the checkpoint diffusers saved already quantized (`from_pretrained` with
TorchAoConfig, then `save_pretrained` in files of the same size; `dtp/loading/prequantized.py`): each rank
reads its slices of the stored int8 / float8 data and scales, no high-precision weight at all.

    python benchmarks/quant_load_memory.py [--workdir benchmarks/_work] [--tp 2 4] [--dtypes fp32 bf16]
        [--prequantized]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import load_memory  # noqa: E402  (the checkpoint and the peak-RSS helpers)

MB = load_memory.MB
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "quant_load_memory.md")


def write_prequantized(path: str, scheme: str) -> str:
    """`path`'s checkpoint loaded by diffusers with TorchAoConfig(scheme) and saved quantized next to it (once)."""
    from diffusers import FluxTransformer2DModel, TorchAoConfig

    from dtp.quant import config_for

    saved = f"{path}-{scheme}"
    if not os.path.isfile(os.path.join(saved, "config.json")):
        config = TorchAoConfig(config_for(scheme))
        model = FluxTransformer2DModel.from_pretrained(path, quantization_config=config, torch_dtype=torch.float32)
        model.save_pretrained(saved, safe_serialization=True, max_shard_size=load_memory.SHARD_SIZE)
    return saved


def measure(
    rank: int, world_size: int, scheme: str, path: str, dtype: str = "fp32", trim: bool = True, saved: bool = False
) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from diffusers import FluxTransformer2DModel, TorchAoConfig

    import dtp
    import dtp.quant.load
    from dtp.loading.load import load
    from dtp.quant import config_for
    from dtp.runtime.memory import local_param_bytes

    if not trim:
        dtp.quant.load.trim_heap = lambda: None

    mesh = dtp.make_mesh(tp=world_size, device_type="cpu")
    config = TorchAoConfig(config_for(scheme))
    dtp.quantize(torch.nn.Linear(16, 16), config_for(scheme))  # torchao's code loaded before the baseline
    gc.collect()
    load_memory._reset_peak()
    before_kb = load_memory._proc_status_kb("VmRSS")
    start, cpu_start = time.perf_counter(), time.process_time()
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    config = None if saved else config  # a checkpoint saved quantized is read as it is
    model, stats = load(FluxTransformer2DModel, path, mesh, quantization_config=config, torch_dtype=torch_dtype)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak_kb = load_memory._proc_status_kb("VmHWM")
    return dict(
        rank=rank,
        increase=(peak_kb - before_kb) * 1024,
        share=local_param_bytes(model),
        bytes_read=stats.bytes_read,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
    )


HEADER = (
    "| tp | scheme | dtype | heap trim | peak RSS increase (MB) | quantized share (MB) | increase / share "
    "| bound 1.25 x share + 150 MB | within bound | bytes read (MB) | load time (s) "
    "| load CPU time (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _row(r: dict) -> str:
    bound = 1.25 * r["share"] + load_memory.FIXED_MB * MB
    return (
        f"| {r['tp']} | {r['scheme']} | {r['dtype']} | {_trim(r)} | "
        f"{r['increase'] / MB:.0f} | {r['share'] / MB:.0f} | "
        f"{r['increase'] / r['share']:.2f} | {bound / MB:.0f} | {'yes' if r['increase'] <= bound else 'no'} | "
        f"{r['bytes_read'] / MB:.0f} | {r['slowest']:.1f} | {r['cpu']:.1f} |"
    )


PREQUANTIZED_NOTE = [
    "Saved quantized, each rank reads only its slices of the stored int8 / float8 data and scales (bytes read =",
    "its share; a rowwise layer's scales whole): no high-precision slice exists, so no heap trim runs. The",
    "increase over the share is the same as when dtp quantizes while loading (tp=4: 174 MB both ways).",
    "",
]


def _trim(r: dict) -> str:
    """The heap-trim column: the trim runs only where dtp quantizes (not for a checkpoint saved quantized)."""
    return "n/a" if r["dtype"].startswith("saved") else "yes" if r["trim"] else "no"


def main() -> None:
    from dtp.testing.launch import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "_work"))
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--schemes", nargs="+", default=["int8wo", "fp8wo"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--compare-trim", action="store_true", help="also run each configuration without the trim")
    parser.add_argument("--prequantized", action="store_true", help="read checkpoints saved already quantized")
    args = parser.parse_args()
    path = os.path.join(args.workdir, "flux-mid")
    load_memory.write_checkpoint(path)
    print(HEADER, flush=True)
    rows = []
    trims = (True, False) if args.compare_trim else (True,)
    for tp, scheme, dtype, trim in itertools.product(args.tp, args.schemes, args.dtypes, trims):
        source = write_prequantized(path, scheme) if args.prequantized else path
        ranks = spawn(measure, tp, scheme, source, dtype, trim, args.prequantized, backend="gloo")
        worst = max(ranks, key=lambda r: r["increase"] / (1.25 * r["share"] + load_memory.FIXED_MB * MB))
        rows.append(
            dict(
                tp=tp,
                scheme=scheme,
                dtype=f"saved {scheme}" if args.prequantized else dtype,
                trim=trim,
                **worst,
                slowest=max(r["seconds"] for r in ranks),
                cpu=max(r["cpu_seconds"] for r in ranks),
            )
        )
        print(_row(rows[-1]), flush=True)
    lines = [
        "# Shard-on-load with quantization: per-rank host memory",
        "",
        f"Command: `python benchmarks/quant_load_memory.py {' '.join(sys.argv[1:])}`".replace(" `", " `").strip(),
        "",
        f"Checkpoint: FluxTransformer2DModel {load_memory.CONFIG} (fp32, {load_memory.SHARD_SIZE} files), "
        f"{'saved quantized by diffusers and read as it is' if args.prequantized else 'loaded with TorchAoConfig'}; "
        "each row is the rank closest to its bound. Load times on a "
        "shared machine are noisy.",
        "",
        HEADER,
        *(_row(r) for r in rows),
        "",
        *(PREQUANTIZED_NOTE if args.prequantized else []),
    ]
    results = RESULTS.replace(".md", "_prequantized.md") if args.prequantized else RESULTS
    os.makedirs(os.path.dirname(results), exist_ok=True)
    with open(results, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
