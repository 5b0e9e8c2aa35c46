"""Parallel VAE, full size: activation peak per rank of the 2026 pipelines' VAE decodes (LTX-2, HunyuanVideo 1.5,
Qwen-Image 2.1, MiniMax-H3) split over N ranks.

Each VAE with diffusers' default configuration (the released widths), on the meta device, run under FakeTensorMode
on torch's fake process group (no compute, no memory): one process plays rank 0 of N (rank 0 holds the most rows).
Latents: LTX-2 (1, 128, 4, 16, 24) -> 25 frames of 512 x 768 (its decoder: patch 4 x three 2x stages in space,
three in time); HunyuanVideo 1.5 (1, 32, 7, 32, 48) -> 25 frames of 512 x 768; Qwen-Image 2.1 (1, 64, 1, 64, 64) ->
one 1024 x 1024 image; MiniMax-H3 (1, 24, 7, 32, 48) -> 28 frames of 512 x 768 (one clip of 7 latent frames; its
default spatial tiling on, as released: 256-pixel tiles, each split over the ranks). bf16.

Peak: live bytes of every storage an op creates, freed when the storage dies (`dtp.analysis.trace.PhaseTrace`);
parameters, buffers and the latent are resident and not counted. The gathered output is counted.

    python benchmarks/vae_2026_full_size.py [--ranks 1 2 4 8] [--vaes AutoencoderKLLTX2Video ...] [--untiled]

Writes benchmarks/results/vae_2026_full_size.md (`--untiled`: vae_2026_full_size_untiled.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from vae_peak import decode_peak

from dtp.analysis.fakepg import meta_model

RESULT = Path(__file__).resolve().parent / "results" / "vae_2026_full_size.md"
LATENTS = {
    "AutoencoderKLLTX2Video": (1, 128, 4, 16, 24),
    "AutoencoderKLHunyuanVideo15": (1, 32, 7, 32, 48),
    "AutoencoderKLQwenImage21": (1, 64, 1, 64, 64),
    "AutoencoderKLMiniMaxH3": (1, 24, 7, 32, 48),
}


def fake_peak(name: str, world: int, untiled: bool = False) -> tuple[int, tuple[int, ...]]:
    """(activation peak bytes of rank 0's decode among `world` ranks, the decoded shape) under FakeTensorMode."""

    def build():
        vae = meta_model(name, {}, torch.bfloat16)
        if untiled:
            vae.disable_tiling()
        return vae

    return decode_peak(build, world, LATENTS[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--vaes", nargs="+", default=list(LATENTS), choices=list(LATENTS))
    parser.add_argument("--untiled", action="store_true", help="tiling off (MiniMax-H3's is on by default)")
    args = parser.parse_args()
    rows = ["| VAE | decoded (B, C, F, H, W) | N | rank 0 peak (MB) | x whole |", "|---|---|--:|--:|--:|"]
    for name in args.vaes:
        whole = None
        for n in args.ranks:
            start = time.perf_counter()
            peak, shape = fake_peak(name, n, args.untiled)
            whole = whole or peak
            rows.append(f"| {name} | {shape} | {n} | {peak / 1e6:.0f} | {peak / whole:.3f} |")
            print(rows[-1], f"({time.perf_counter() - start:.0f} s)", flush=True)
    text = (
        "# Parallel VAE, full size: the 2026 pipelines' VAE decodes, bf16, activation peak of rank 0\n\n"
        "FakeTensorMode + torch's fake process group + a dispatch-mode live-bytes counter "
        "(`dtp.analysis.trace.PhaseTrace`; no compute); the first N is the reference. Command: "
        f"`python benchmarks/vae_2026_full_size.py --ranks {' '.join(map(str, args.ranks))} "
        f"--vaes {' '.join(args.vaes)}{' --untiled' if args.untiled else ''}`\n\n" + "\n".join(rows) + "\n"
    )
    print(text)
    RESULT.parent.mkdir(exist_ok=True)
    (RESULT.with_name(RESULT.stem + "_untiled.md") if args.untiled else RESULT).write_text(text)


if __name__ == "__main__":
    main()
