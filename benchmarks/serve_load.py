"""`dtp serve` under load: 200 requests from 16 concurrent clients against `torchrun --nproc-per-node 2 -m dtp serve`
on the tiny FLUX.1 pipeline (CPU, gloo, fp32, two sizes: 32 x 32 and 16 x 16), with batching off (`--max-batch 1`)
and on (`--max-batch 4 --batch-wait-ms 50`), with 2 replicas of 2 ranks (`--replicas 2`, 4 ranks), against
back-to-back `dtp run` launches of the same generation.

Counts lost requests (no 200) and duplicated ones (two answers with the same image, or the server logging more
generations than requests: every request has its own seed, so every image differs), and prints the median and
p99 latency, the throughput and the mean batch size of each way. Writes benchmarks/results/serve_load.json and
serve_load.md (serve_load_partial.* when `--ways` picks some of the ways).

    python benchmarks/serve_load.py [--requests 200] [--clients 16] [--runs 2] [--ways "--max-batch 1" ...]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "serve_load.json"
SIZE, STEPS = 32, 2
SIZES = (32, 16)  # two batch keys
WAYS = {  # name: (flags, ranks)
    "--max-batch 1": ((), 2),
    "--max-batch 4": (("--max-batch", "4", "--batch-wait-ms", "50"), 2),
    "--replicas 2": (("--replicas", "2"), 4),
}
REPLICA_LINE = r"dtp serve: (?:replica (\d+): )?(?:request|batch of) \d+"  # one line per pipeline call
LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "dtp"]


def body(seed: int) -> dict:
    size = SIZES[seed % len(SIZES)]
    return {"prompt": "a cat", "seed": seed, "size": f"{size}x{size}", "num_inference_steps": STEPS}


def load(url: str, requests: int, clients: int) -> dict:
    import httpx

    def one(seed: int):
        start = time.perf_counter()
        answer = httpx.post(f"{url}/v1/images/generations", json=body(seed), timeout=600)
        image = answer.json()["data"][0]["b64_json"] if answer.status_code == 200 else None
        return answer.status_code, time.perf_counter() - start, image

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    latencies = sorted(seconds for _, seconds, _ in answers)
    images = [hashlib.sha256(image.encode()).hexdigest() for _, _, image in answers if image is not None]
    return {
        "requests": requests,
        "clients": clients,
        "ok": sum(code == 200 for code, _, _ in answers),
        "lost": sum(code != 200 for code, _, _ in answers),
        "distinct_images": len(set(images)),
        "median_latency_s": statistics.median(latencies),
        "p99_latency_s": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
        "wall_s": wall,
        "throughput_per_s": requests / wall,
    }


def back_to_back(model_dir: Path, runs: int, folder: Path) -> dict:
    """`runs` consecutive `torchrun ... dtp run` launches of one generation each (load, generate, exit)."""
    seconds = []
    for seed in range(runs):
        command = [*LAUNCH, "run", "--model-dir", str(model_dir), "--prompt", "a cat", "--seed", str(seed)]
        command += ["--steps", str(STEPS), "--height", str(SIZE), "--width", str(SIZE), "--dtype", "fp32"]
        command += ["--output", str(folder / f"run{seed}.png")]
        start = time.perf_counter()
        subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True)
        seconds.append(time.perf_counter() - start)
    return {"runs": runs, "median_s": statistics.median(seconds), "throughput_per_s": 1 / statistics.mean(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--runs", type=int, default=2, help="back-to-back `dtp run` launches")
    parser.add_argument("--ways", nargs="+", choices=list(WAYS), default=list(WAYS), help="the ways to measure")
    args = parser.parse_args()
    results = RESULTS if args.ways == list(WAYS) else RESULTS.with_name("serve_load_partial.json")
    from dtp.families.pipelines import tiny_checkpoint
    from dtp.testing.serving import serving

    ways = {}
    with tempfile.TemporaryDirectory(prefix="dtp-serve-load-") as tmp:
        folder = Path(tmp)
        model_dir = tiny_checkpoint("flux", root=folder)
        for name in args.ways:
            flags, ranks = WAYS[name]
            log = folder / f"server{len(ways)}.log"
            with serving(model_dir, log, *flags, nproc=ranks) as server:
                served = load(server.url, args.requests, args.clients)
            text = log.read_text()
            single = len(re.findall(r"dtp serve: (?:replica \d+: )?request \d+: .* ok", text))
            batched = [int(n) for n in re.findall(r"dtp serve: (?:replica \d+: )?batch of (\d+) .* ok", text)]
            served["ranks"] = ranks
            served["by_replica"] = {
                replica or "0": n for replica, n in collections.Counter(re.findall(REPLICA_LINE, text)).items()
            }
            generated = single + sum(batched)
            served["generated_by_server"] = generated
            served["pipeline_calls"] = single + len(batched)
            served["mean_batch"] = generated / max(1, served["pipeline_calls"])
            served["duplicated"] = (served["ok"] - served["distinct_images"]) + max(0, generated - args.requests)
            ways[name] = served
        runs = back_to_back(model_dir, args.runs, folder) if args.runs else None
    result = {
        "pipeline": "tiny FLUX.1, 32x32 and 16x16, 2 steps, fp32, gloo ranks (CPU)",
        "serve": ways,
        "dtp_run": runs,
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=1) + "\n")
    picked = "" if args.ways == list(WAYS) else " --ways " + " ".join(f'"{name}"' for name in args.ways)
    lines = [
        f"`python benchmarks/serve_load.py --requests {args.requests} --clients {args.clients} --runs {args.runs}"
        f"{picked}`: {result['pipeline']}.",
        "",
        "| way | ranks | requests | lost | duplicated | mean batch | median s | p99 s | per second |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, served in ways.items():
        lines.append(
            f"| dtp serve {name}, {args.clients} clients | {served['ranks']} | {served['requests']} | {served['lost']} "
            f"| {served['duplicated']} | {served['mean_batch']:.2f} | {served['median_latency_s']:.2f} "
            f"| {served['p99_latency_s']:.2f} | {served['throughput_per_s']:.2f} |"
        )
    if runs:
        lines.append(
            f"| back-to-back dtp run | 2 | {runs['runs']} | 0 | 0 | 1 | {runs['median_s']:.2f} | - "
            f"| {runs['throughput_per_s']:.3f} |"
        )
    lines.append("")
    throughput = {name: served["throughput_per_s"] for name, served in ways.items()}
    if "--max-batch 1" in throughput and "--max-batch 4" in throughput:
        lines.append(
            f"batching on / off: {throughput['--max-batch 4'] / throughput['--max-batch 1']:.2f}x the throughput."
        )
    if "--replicas 2" in ways:
        by_replica = ", ".join(f"replica {k}: {n}" for k, n in sorted(ways["--replicas 2"]["by_replica"].items()))
        lines.append(f"--replicas 2: pipeline calls per replica: {by_replica}.")
    table = "\n".join(lines) + "\n"
    results.with_suffix(".md").write_text(table)
    print(table + f"wrote {results} and {results.with_suffix('.md')}")


if __name__ == "__main__":
    main()
