"""A stuck rank under `dtp run`: rank 1 sleeps before generating; the others must name it, then time out.

Runs `dtp run` on the demo's tiny FLUX pipeline with torch's launcher (2 gloo ranks), rank 1 held
back `--stall` seconds in 'loading the pipeline' while rank 0 enters the first transformer call.
Prints and writes to `benchmarks/results/stuck_rank.md` the watchdog's lines, the process
group's timeout error and the wall time. Expected: both ranks log who is behind after
min(60, timeout / 2) s, the group fails after `--timeout` s, torchrun exits nonzero.

    python benchmarks/stuck_rank.py --timeout 30 --stall 60
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "stuck_rank.md"


def stalled_rank_main(argv: list[str]) -> int:
    """`dtp run` with its generation held back on rank 1 (the stuck rank)."""
    import dtp.tools.run as run
    from dtp.tools.cli import main

    run_request = run.run_request

    def held_back(pipe, *args, **kwargs):
        if os.environ["RANK"] == "1":
            time.sleep(float(os.environ["DTP_STALL_S"]))
        return run_request(pipe, *args, **kwargs)

    run.run_request = held_back
    return main(["run", *argv])


def launch(timeout_s: float, stall_s: float) -> tuple[int, float, str]:
    from dtp.families.pipelines import tiny_checkpoint

    model_dir = tiny_checkpoint("flux")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        __file__,
        "_rank",
        "--model-dir",
        str(model_dir),
        "--prompt",
        "a cat",
        "--steps",
        "2",
        "--height",
        "32",
        "--width",
        "32",
        "--dtype",
        "float32",
        "--output",
        str(Path(tempfile.mkdtemp(prefix="dtp-stuck-")) / "stuck.png"),  # never written: the run times out first
        "--timeout",
        str(timeout_s),
        "--whole-text-encoders",  # else rank 0 waits in the sharded text encoder, before its first posted stage
    ]
    env = {**os.environ, "DTP_STALL_S": str(stall_s), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    start = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s + stall_s + 600)
    return done.returncode, time.monotonic() - start, done.stdout + done.stderr


def main() -> None:
    if sys.argv[1:2] == ["_rank"]:
        sys.exit(stalled_rank_main(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=30)
    parser.add_argument("--stall", type=float, default=60)
    args = parser.parse_args()
    code, seconds, output = launch(args.timeout, args.stall)
    lines = [line.strip() for line in output.splitlines() if "dtp run: rank" in line or "Timed out" in line]
    lines = [line[line.index("dtp run") :] if "dtp run" in line else line for line in lines]
    text = (
        f"# A stuck rank under dtp run\n\nCommand: `python benchmarks/stuck_rank.py --timeout {args.timeout:g} "
        f"--stall {args.stall:g}` (2 gloo ranks, tiny FLUX).\n\ntorchrun exit code {code} after {seconds:.0f} s "
        f"(including start-up and loading). Watchdog and timeout lines:\n\n```\n" + "\n".join(lines) + "\n```\n"
    )
    print(text)
    RESULTS.write_text(text)


if __name__ == "__main__":
    main()
