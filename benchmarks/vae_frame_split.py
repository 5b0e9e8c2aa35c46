"""Would splitting frames over ranks (instead of rows) decode Wan's causal VAE exactly? Measured: no.

AutoencoderKLWan decodes one latent frame per decoder call; every causal conv keeps the last 2 frames of its
input from the previous call (`feat_cache`), and the first call is special (`first_chunk`: the temporal
upsamplers emit 1 frame, later calls 4). A rank given latent frames [k, T) without the earlier chunks starts
with an empty cache. This script decodes T latent frames whole, then frames [k - w, T) with w warm-up chunks
(decoded and thrown away to refill the caches), and compares the frames of chunks k.. with the whole decode:

- w = 0 (a plain frame split): chunk k is decoded as a first chunk (1 frame instead of 4), the others differ;
- w > 0: extra work w / (T - k) per rank; exact only once w covers the decoder's temporal receptive field
  (every causal conv adds 2 frames at its frame rate), i.e. effectively the whole history;
- exact = a pipeline: rank k starts only when rank k - 1 hands over its caches, so one video takes as long
  as on one rank (row strips: every rank works on every chunk at once).

Wan 2.1's released configuration (diffusers' defaults), random weights, fp32, one process, a small frame size
(the time axis is what matters here): `python benchmarks/vae_frame_split.py [--frames 6] [--size 32] [--k 3]`.
Writes benchmarks/results/vae_frame_split.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

RESULT = Path(__file__).resolve().parent / "results" / "vae_frame_split.md"


@torch.no_grad()
def main() -> None:
    from diffusers import AutoencoderKLWan

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=6, help="latent frames T")
    parser.add_argument("--size", type=int, default=32, help="video height and width (pixels)")
    parser.add_argument("--k", type=int, default=3, help="first latent frame of the later rank")
    args = parser.parse_args()
    torch.manual_seed(0)
    vae = AutoencoderKLWan().eval()
    latent = args.size // 8
    z = torch.randn(1, vae.config.z_dim, args.frames, latent, latent, generator=torch.Generator().manual_seed(1))
    start = time.process_time()
    whole = vae.decode(z).sample
    seconds = time.process_time() - start
    first = 1 + 4 * (args.k - 1)  # the whole decode's first frame of chunk k (chunk 0 -> 1 frame, then 4 each)
    ref = whole[:, :, first:]
    scale = float(ref.abs().max())
    rows = ["| warm-up chunks w | frames of chunks k.. | max abs diff / max abs | extra work per rank |"]
    rows.append("|--:|--:|--:|--:|")
    for warm in range(0, args.k + 1):
        part = vae.decode(z[:, :, args.k - warm :]).sample
        mine = part[:, :, 1 + 4 * (warm - 1) :] if warm else part
        count = f"{mine.shape[2]} (whole: {ref.shape[2]})"
        if mine.shape[2] != ref.shape[2]:
            diff = "shape differs"
            tail = float((mine[:, :, 1:] - ref[:, :, 4:]).abs().max()) / scale  # the chunks after k
            diff += f"; chunks k+1..: {tail:.2e}"
        else:
            diff = f"{float((mine - ref).abs().max()) / scale:.2e}"
        rows.append(f"| {warm} | {count} | {diff} | {warm / (args.frames - args.k):.2f} |")
        print(rows[-1], flush=True)
    text = (
        f"# Frame split of Wan's causal VAE: decoding latent frames [k - w, T) instead of [0, T)\n\n"
        f"AutoencoderKLWan (Wan 2.1 configuration, random weights, fp32), T = {args.frames} latent frames "
        f"({whole.shape[2]} video frames) at {args.size} x {args.size}, k = {args.k}. Whole decode: {seconds:.1f} s "
        f"CPU. Command: `python benchmarks/vae_frame_split.py --frames {args.frames} --size {args.size} "
        f"--k {args.k}`\n\n" + "\n".join(rows) + "\n"
    )
    print(text)
    RESULT.write_text(text)


if __name__ == "__main__":
    main()
