"""Parallel VAE, full size, video: activation peak per rank of Wan's VAE decode at 480p x 81 frames.

AutoencoderKLWan with Wan 2.1's released configuration (diffusers' defaults: base_dim 96, z_dim 16, dim_mult
(1, 2, 4, 4), 2 res blocks, temporal downsampling (False, True, True)), on the meta device, run under
FakeTensorMode on torch's fake process group (no compute, no memory): one process plays rank 0 of N (rank 0
holds the most rows: `split_rows` gives the remainder to the first ranks), and with `--last-rank` the last
rank too. The latent is (1, 16, 21, 60, 104) -> video (1, 3, 81, 480, 832), fp32 (the Wan pipelines
decode in the VAE's fp32).

Peak: live bytes of every storage an op creates, freed when the storage dies (`dtp.analysis.trace.PhaseTrace`, a
dispatch-mode counter; torch's MemTracker refuses the decoder's per-frame calls of the same modules), minus
nothing: parameters, buffers and the latent are resident and not counted. Wan decodes one latent frame per
call with a per-layer temporal cache, so the peak is that of one frame's decode plus the caches and the
growing output.

    python benchmarks/vae_video_full_size.py [--ranks 1 2 4 8] [--frames 81] [--height 480] [--width 832]

Writes benchmarks/results/vae_video_full_size.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from dtp.analysis.trace import PhaseTrace
from dtp.vae import parallelize_vae

RESULT = Path(__file__).resolve().parent / "results" / "vae_video_full_size.md"


def fake_peak(world: int, rank: int, frames: int, height: int, width: int, strips: bool = False) -> int:
    """Activation peak bytes of rank `rank`'s Wan decode among `world` ranks (FakeTensorMode, fake process group)."""
    import torch.distributed as dist
    from diffusers import AutoencoderKLWan
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with torch.device("meta"):
            vae = AutoencoderKLWan().eval()
        if world > 1:
            parallelize_vae(vae, dist.group.WORLD, gather_output=not strips)
        latent_frames = (frames - 1) // 4 + 1
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            vae.to_empty(device="cpu")
            z = torch.empty(1, vae.config.z_dim, latent_frames, height // 8, width // 8)
            resident = [*vae.parameters(), *vae.buffers(), z]
            with PhaseTrace(resident=resident) as trace:
                video = vae.decode(z).sample
            assert strips or tuple(video.shape) == (1, 3, frames, height, width), video.shape
            return trace.trace.peak_bytes
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--last-rank", action="store_true", help="also trace the last rank (twice the time)")
    parser.add_argument("--strips", action="store_true", help="gather_output=False: each rank keeps its rows")
    args = parser.parse_args()
    shape = (args.frames, args.height, args.width)
    rows = ["| N | rank 0 peak (MB) | last rank peak (MB) | x whole (max of the two) |", "|--:|--:|--:|--:|"]
    whole = None
    for n in args.ranks:
        start = time.perf_counter()
        peaks = [fake_peak(n, r, *shape, args.strips) for r in sorted({0, n - 1} if args.last_rank else {0})]
        whole = whole or max(peaks)
        rows.append(f"| {n} | {peaks[0] / 1e6:.0f} | {peaks[-1] / 1e6:.0f} | {max(peaks) / whole:.3f} |")
        print(rows[-1], f"({time.perf_counter() - start:.0f} s)", flush=True)
    text = (
        f"# Parallel VAE, full size: AutoencoderKLWan (Wan 2.1) decode of {args.frames} frames at "
        f"{args.height} x {args.width}, fp32, activation peak per rank\n\n"
        "FakeTensorMode + torch's fake process group + a dispatch-mode live-bytes counter "
        "(`dtp.analysis.trace.PhaseTrace`; no compute). Command: `python benchmarks/vae_video_full_size.py "
        f"--ranks {' '.join(map(str, args.ranks))} --frames {args.frames} --height {args.height} "
        f"--width {args.width}{' --last-rank' if args.last_rank else ''}{' --strips' if args.strips else ''}`"
        f"{' (each rank keeps its rows: gather_output=False)' if args.strips else ''}\n\n" + "\n".join(rows) + "\n"
    )
    print(text)
    RESULT.parent.mkdir(exist_ok=True)
    (RESULT.with_name(RESULT.stem + "_strips.md") if args.strips else RESULT).write_text(text)


if __name__ == "__main__":
    main()
