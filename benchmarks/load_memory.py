"""Per-rank host memory of loading a checkpoint: dtp.from_pretrained against diffusers + parallelize.

Writes a mid-size FLUX.1 checkpoint (dim 1536, 2 double + 3 single blocks, ~1.16 GB fp32, split in
several safetensors files) under --workdir, then loads it on tp = 1, 2, 4 gloo processes:
  * dtp:      dtp.loading.load.load (= dtp.from_pretrained + stats): each rank reads its own slices;
  * baseline: FluxTransformer2DModel.from_pretrained (the whole model on every rank), then dtp.parallelize.
For each rank: peak RSS increase during the load (VmHWM after the load minus VmRSS before it, the
peak having been reset through /proc/self/clear_refs: ru_maxrss is inherited at spawn), its own
share of the weights (local parameter bytes after sharding), bytes read from the checkpoint and
the load time. Prints a table and writes it to benchmarks/results/load_memory.md.

    python benchmarks/load_memory.py [--workdir benchmarks/_work] [--tp 1 2 4]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import sys
import time

import torch

MB = 1_000_000  # decimal: the acceptance bound and the ">= 1 GB" are in decimal units
CONFIG = dict(
    patch_size=1,
    in_channels=64,
    num_layers=2,
    num_single_layers=3,
    attention_head_dim=128,
    num_attention_heads=12,
    joint_attention_dim=1536,
    pooled_projection_dim=768,
    guidance_embeds=False,
    axes_dims_rope=(16, 56, 56),
)
SHARD_SIZE = "300MB"
FIXED_MB = 150  # allowance of the acceptance bound: 1.25 x share + 150 MB
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "load_memory.md")


def write_checkpoint(path: str) -> None:
    """A random-weight checkpoint of CONFIG, saved by diffusers in several files (skipped if present)."""
    from diffusers import FluxTransformer2DModel

    if os.path.isfile(os.path.join(path, "diffusion_pytorch_model.safetensors.index.json")):
        return
    torch.manual_seed(0)
    model = FluxTransformer2DModel(**CONFIG)
    model.save_pretrained(path, safe_serialization=True, max_shard_size=SHARD_SIZE)


def _proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    # "5" resets VmHWM to the current RSS (Linux >= 4.0); without it the spawned process inherits
    # nothing useful either way: ru_maxrss carries the parent's peak.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(rank: int, world_size: int, method: str, path: str) -> dict:
    """One rank: load with `method`, return peak RSS increase, own share, bytes read, seconds."""
    from diffusers import FluxTransformer2DModel

    import dtp
    from dtp.loading.checkpoint import open_checkpoint
    from dtp.loading.load import load
    from dtp.runtime.memory import local_param_bytes

    mesh = dtp.make_mesh(tp=world_size, device_type="cpu")
    gc.collect()
    _reset_peak()
    before_kb = _proc_status_kb("VmRSS")
    start = time.perf_counter()
    if method == "dtp":
        model, stats = load(FluxTransformer2DModel, path, mesh)
        bytes_read = stats.bytes_read
    else:
        model = dtp.parallelize(FluxTransformer2DModel.from_pretrained(path), mesh)
        bytes_read = sum(info.nbytes for info in open_checkpoint(path).tensors.values())  # it reads every tensor
    seconds = time.perf_counter() - start
    peak_kb = _proc_status_kb("VmHWM")
    return dict(
        rank=rank,
        increase=(peak_kb - before_kb) * 1024,
        share=local_param_bytes(model),
        bytes_read=bytes_read,
        seconds=seconds,
    )


def run(path: str, tps: list[int]) -> list[dict]:
    from dtp.testing.launch import spawn

    rows = []
    for tp in tps:
        for method in ("dtp", "baseline"):
            ranks = spawn(measure, tp, method, path, backend="gloo")
            worst = max(ranks, key=lambda r: r["increase"] / (1.25 * r["share"] + FIXED_MB * MB))
            rows.append(dict(tp=tp, method=method, **worst, slowest=max(r["seconds"] for r in ranks)))
            print(_row(rows[-1]), flush=True)
    return rows


HEADER = (
    "| tp | method | peak RSS increase (MB) | own share (MB) | increase / share | bound 1.25 x share + 150 MB "
    "| within bound | bytes read (MB) | load time (s) |\n|---|---|---|---|---|---|---|---|---|"
)


def _row(r: dict) -> str:
    bound = 1.25 * r["share"] + FIXED_MB * MB
    return (
        f"| {r['tp']} | {r['method']} | {r['increase'] / MB:.0f} | {r['share'] / MB:.0f} | "
        f"{r['increase'] / r['share']:.2f} | {bound / MB:.0f} | {'yes' if r['increase'] <= bound else 'no'} | "
        f"{r['bytes_read'] / MB:.0f} | {r['slowest']:.1f} |"
    )


def write_results(rows: list[dict], path: str, total_bytes: int, num_files: int, command: str) -> None:
    lines = [
        "# Checkpoint loading: per-rank host memory",
        "",
        f"Command: `{command}`",
        "",
        f"Checkpoint: FluxTransformer2DModel {CONFIG}, {total_bytes / MB:.0f} MB fp32 in {num_files} safetensors "
        f"files (max_shard_size {SHARD_SIZE}). Machine: {platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}; gloo processes on CPU (one per rank).",
        "",
        "Each row is the rank closest to its bound (peak RSS increase relative to 1.25 x its share + 150 MB). "
        "Peak RSS increase = VmHWM after the load - VmRSS before it, with the peak reset via /proc/self/clear_refs. "
        "Own share = bytes of the rank's local parameters after sharding. Baseline = diffusers "
        "`from_pretrained` of the whole model on every rank, then `dtp.parallelize`; it reads every tensor. "
        "Load time is the slowest rank's (2 cores shared with other work: noisy).",
        "",
        f"diffusers low_cpu_mem_usage: {_low_cpu_mem_note()}",
        "",
        HEADER,
        *(_row(r) for r in rows),
        "",
    ]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _low_cpu_mem_note() -> str:
    if importlib.util.find_spec("accelerate") is not None:
        return "on (accelerate is installed)."
    return (
        "off (accelerate is not installed): the baseline builds the randomly initialized model, then "
        "loads the state dict into it, hence about 1.5 x the full model per rank."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "_work"))
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args()

    from dtp.loading.checkpoint import open_checkpoint

    path = os.path.join(args.workdir, "flux-mid")
    write_checkpoint(path)
    checkpoint = open_checkpoint(path)
    total = sum(info.nbytes for info in checkpoint.tensors.values())
    print(f"checkpoint {path}: {total / MB:.0f} MB in {len(checkpoint.files)} files\n{HEADER}", flush=True)
    rows = run(path, args.tp)
    command = "python benchmarks/load_memory.py " + " ".join(sys.argv[1:])
    write_results(rows, args.results, total, len(checkpoint.files), command.strip())
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
