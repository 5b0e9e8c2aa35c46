"""Parallel VAE, full size, issue 35's and 45's VAEs: activation peak per rank of the decode of Sana's DC-AE,
CogVideoX's VAE, EasyAnimate's Magvit VAE, Mochi's and Cosmos 1's, whole and split over N ranks.

Released configurations: AutoencoderDC as dc-ae-f32c32-sana-1.0 (6 levels of 128 .. 1024 channels, 32 latent
channels, stride-2 conv downsampling, interpolation upsampling, 5 x 5 multiscale linear attention in the 3 deepest
levels); AutoencoderKLCogVideoX and AutoencoderKLMagvit with diffusers' defaults (CogVideoX's: 128 .. 512 channels, 16
latent channels, 4x in time; EasyAnimate's: 128 .. 512 channels, 16 latent channels, spatial GroupNorm);
AutoencoderKLMochi and AutoencoderKLCosmos with diffusers' defaults (Mochi 1's: 128 .. 768 channels, 12 latent channels,
8x in space, 6x in time, untiled; Cosmos 1's CV8x8x8: Haar patch 4, 256 .. 512 channels, 16 latent channels). On the
meta device, run under FakeTensorMode on torch's fake process group (no compute, no memory): one process plays rank 0
of N (rank 0 holds the most rows). Peak: live bytes of every storage an op creates (`dtp.analysis.trace.PhaseTrace`),
parameters, buffers and the latent not counted. The output is gathered on every rank (the default).

    python benchmarks/vae_more_full_size.py [--vaes dc cogvideox magvit cogvideox-512 mochi cosmos] [--ranks 1 2 4 8]
        [--dtype bf16] [--every-rank] [--keep-others]

Writes benchmarks/results/vae_more_full_size.md. With --every-rank each N > 1 is traced once per rank (this process
plays each in turn) and the largest rank's peak is reported, with that rank; writes vae_more_full_size_every_rank.md.
With --keep-others the file keeps its rows of the VAEs not in --vaes (and says which command measured them): a full
run is 24 traces, tens of minutes on a loaded machine, for a change that touches one VAE.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from vae_peak import decode_peak

from dtp.analysis.fakepg import meta_model

RESULT = Path(__file__).resolve().parent / "results" / "vae_more_full_size.md"
SANA_DC_AE = dict(
    latent_channels=32,
    encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
    decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
    encoder_block_out_channels=(128, 256, 512, 512, 1024, 1024),
    decoder_block_out_channels=(128, 256, 512, 512, 1024, 1024),
    encoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
    decoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
    encoder_layers_per_block=(2, 2, 2, 3, 3, 3),
    decoder_layers_per_block=(3, 3, 3, 3, 3, 3),
    downsample_block_type="conv",
    upsample_block_type="interpolate",
    scaling_factor=0.41407,
)
# name -> (diffusers class, config, latent (C, frames or None, rows, columns), what it decodes)
CASES = {
    "dc": ("AutoencoderDC", SANA_DC_AE, (32, None, 64, 64), "Sana's DC-AE, 2048 x 2048"),
    "cogvideox": ("AutoencoderKLCogVideoX", {}, (16, 13, 60, 90), "CogVideoX, 49 frames at 480 x 720"),
    "magvit": ("AutoencoderKLMagvit", {}, (16, 13, 64, 64), "EasyAnimate (Magvit), 49 frames at 512 x 512"),
    # 64 latent rows (8 per rank at N = 8) instead of 60 (8 on rank 0, 7.5 on average): the excess over 1/N above
    "cogvideox-512": ("AutoencoderKLCogVideoX", {}, (16, 13, 64, 90), "CogVideoX, 49 frames at 512 x 720"),
    # issue 45's (diffusers' default configs: Mochi 1's, Cosmos 1's CV8x8x8): untiled decodes
    "mochi": ("AutoencoderKLMochi", {}, (12, 4, 60, 106), "Mochi, 19 frames at 480 x 848"),
    "cosmos": ("AutoencoderKLCosmos", {}, (16, 3, 88, 160), "Cosmos 1, 17 frames at 704 x 1280"),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def fake_peak(case: str, world: int, dtype: torch.dtype, rank: int = 0) -> tuple[int, tuple]:
    """(activation peak bytes of `rank`'s decode among `world` ranks, output shape) under FakeTensorMode."""
    class_name, config, latent, _ = CASES[case]
    shape = (1, latent[0]) + tuple(s for s in latent[1:] if s is not None)
    return decode_peak(lambda: meta_model(class_name, config, dtype), world, shape, dtype, rank)


def largest_peak(case: str, world: int, dtype: torch.dtype, every_rank: bool) -> tuple[int, int, tuple]:
    """(peak bytes, the rank that has it, output shape): rank 0's, or the largest of every rank's."""
    ranks = range(world) if every_rank else (0,)
    (peak, shape), rank = max((fake_peak(case, world, dtype, r), r) for r in ranks)
    return peak, rank, shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vaes", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--every-rank", action="store_true", help="trace every rank, report the largest peak")
    parser.add_argument("--keep-others", action="store_true", help="keep the result file's rows of other VAEs")
    args = parser.parse_args()
    who = "largest rank's peak (MB) | rank" if args.every_rank else "rank 0 peak (MB)"
    rows = [f"| VAE | decodes | N | {who} | x whole |", "|---|---|--:|--:|--:|" + ("--:|" if args.every_rank else "")]
    for case in args.vaes:
        whole = None
        for n in args.ranks:
            start = time.perf_counter()
            peak, rank, shape = largest_peak(case, n, DTYPES[args.dtype], args.every_rank)
            whole = whole or peak
            cells = [CASES[case][0], CASES[case][3], n, f"{peak / 1e6:.0f}", *([rank] if args.every_rank else [])]
            rows.append("| " + " | ".join(map(str, cells)) + f" | {peak / whole:.3f} |")
            print(rows[-1], shape, f"({time.perf_counter() - start:.0f} s)", flush=True)
    result = RESULT.with_name("vae_more_full_size_every_rank.md") if args.every_rank else RESULT
    switches = {"every-rank": args.every_rank, "keep-others": args.keep_others}
    flags = "".join(f" --{name}" for name, on in switches.items() if on)
    command = (
        f"`python benchmarks/vae_more_full_size.py --vaes {' '.join(args.vaes)} "
        f"--ranks {' '.join(map(str, args.ranks))} --dtype {args.dtype}{flags}`"
    )
    if args.keep_others and result.exists():
        rows, command = _merged(result.read_text(), rows, args.vaes, command)
    text = (
        f"# Parallel VAE, full size: decode activation peak per rank, {args.dtype}\n\n"
        "FakeTensorMode + torch's fake process group + a dispatch-mode live-bytes counter "
        "(`dtp.analysis.trace.PhaseTrace`; no compute); the first N's peak is the `x whole` base. Command: "
        f"{command}\n\n" + "\n".join(rows) + "\n"
    )
    print(text)
    result.parent.mkdir(exist_ok=True)
    result.write_text(text)


def _merged(old: str, rows: list[str], measured: list[str], command: str) -> tuple[list[str], str]:
    """The table in CASES order: the new rows of the measured VAEs, the old file's rows of the others; the command
    line says which rows each command measured."""
    old_command = old.split("Command: ", 1)[1].split("\n\n", 1)[0].split(" (rows of ", 1)[0]
    old_rows = [line for line in old.splitlines() if line.startswith("| ") and not line.startswith("| VAE |")]
    table = rows[:2]
    for case in CASES:
        source = rows[2:] if case in measured else old_rows
        table += [row for row in source if row.split(" | ")[1] == CASES[case][3]]
    kept = [CASES[case][0] + " (" + CASES[case][3] + ")" for case in CASES if case not in measured]
    return table, f"{command} (rows of {', '.join(kept)}: from an earlier run of {old_command})"


if __name__ == "__main__":
    main()
