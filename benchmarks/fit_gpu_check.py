"""`dtp fit`'s predicted peak at tp=1 against the device's measured peak: the medium FLUX.1 + VAE, one generation.

    PYTHONPATH=. python benchmarks/fit_gpu_check.py --device cuda [--dtype bf16] [--sizes 1024 2048]

For each image size: `dtp.fit(pipeline dir, 1 GPU, ...)` predicts the per-rank peak (weights + the largest
activation phase of text encoding, one denoising step, VAE decode, traced on fake tensors); the same
pipeline (`dtp.testing.medium`, random weights, no hub) is loaded by diffusers onto the device and run
once (one step, 512 prompt tokens); measured = `torch.cuda.max_memory_allocated` from just before the
call (weights already resident), or torch's MemTracker with `--device cpu`. Prints a table and writes
`benchmarks/results/fit_gpu_check.md`. Needs torch, diffusers, transformers; about a minute on one GPU.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import dtp
from dtp.policy import parse_dtype
from dtp.testing.medium import medium_checkpoint

PROMPT = "a photo of a cat"
TEXT_TOKENS = 512


def measured_peak(pipe, device: torch.device, size: int) -> int:
    """Peak bytes allocated on `device` during one generation at `size`^2 (weights included)."""
    run = dict(prompt=PROMPT, height=size, width=size, num_inference_steps=1, max_sequence_length=TEXT_TOKENS)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        with torch.no_grad():
            pipe(**run, output_type="np")
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.nn.modules.module import register_module_forward_pre_hook

    tracker = MemTracker()
    tracker.track_external(*(m for m in pipe.components.values() if isinstance(m, torch.nn.Module)))

    def forget(module, args) -> None:  # MemTracker refuses a module called twice; only its global peak is read
        tracker.memory_tracking.pop(module, None)

    handle = register_module_forward_pre_hook(forget)
    try:
        with torch.no_grad(), tracker:
            pipe(**run, output_type="np")
    finally:
        handle.remove()
    return sum(v["Total"] for v in tracker.get_tracker_snapshot("peak").values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    args = parser.parse_args()
    from diffusers import DiffusionPipeline

    device, dtype = torch.device(args.device), parse_dtype(args.dtype)
    lines = [
        f"# dtp fit vs measured peak: medium FLUX.1 + VAE, {args.dtype}, tp=1, {device.type}",
        "",
        "| image | predicted GB | measured GB | error | predicted phase | weights GB |",
        "|---|---:|---:|---:|---|---:|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        directory = medium_checkpoint(Path(tmp) / "medium-flux")
        pipe = DiffusionPipeline.from_pretrained(directory, torch_dtype=dtype).to(device)
        pipe.set_progress_bar_config(disable=True)
        for size in args.sizes:
            only = {"quant": None}
            report = dtp.fit(directory, 1, "1000GB", height=size, width=size, dtype=args.dtype, only=only,
                             text_tokens=TEXT_TOKENS)  # fmt: skip
            (row,) = report["rows"]
            measured = measured_peak(pipe, device, size)
            error = (row["peak_bytes"] - measured) / measured
            weights = row["resident_bytes"][row["peak_phase"]]
            lines.append(
                f"| {size}² | {row['peak_bytes'] / 1e9:.3f} | {measured / 1e9:.3f} | {error:+.1%} | "
                f"{row['peak_phase']} | {weights / 1e9:.3f} |"
            )
            print(lines[-1], flush=True)
    out = Path(__file__).resolve().parent / "results" / "fit_gpu_check.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
