"""`dtp serve` under load: 200 requests from 16 concurrent clients against `torchrun -m dtp serve` on the tiny
pipelines (CPU, gloo, fp32, two sizes: 32 x 32 and 16 x 16, 2 steps), each way a fresh server:

    images                    synchronous /v1/images/generations on the tiny FLUX.1, 2 ranks (tp 2), --max-batch 1
    images batched            the same with --max-batch 4 --batch-wait-ms 50
    images replicas           --replicas 2: 4 ranks, two replicas of tp 2
    images replicas batched   both
    videos ...                the same four as asynchronous jobs of OpenAI's video API on the tiny Wan 2.1 (5 frames,
                              --cp 2 in each replica): POST /v1/videos, poll GET /v1/videos/{id}, download the mp4

and back-to-back `dtp run` launches of one image. Counts lost requests (no 200; a job not completed) and duplicated
ones (two answers with the same bytes, the server logging more generations than requests, or more jobs listed:
every request has its own seed, so every output differs), and prints the median and p99 latency (a job's: from its
POST to the poll that sees it finished), the throughput and the mean batch size of each way. Writes
benchmarks/results/serve_load.json and serve_load.md (serve_load_partial.* when `--ways` picks some of the ways).

    python benchmarks/serve_load.py [--requests 200] [--video-requests N] [--clients 16] [--runs 2]
                                    [--ways images "videos batched" ...]
"""

from __future__ import annotations

import argparse
import base64
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
SIZE, STEPS, FRAMES = 32, 2, 5
SIZES = (32, 16)  # two batch keys
BATCH = ("--max-batch", "4", "--batch-wait-ms", "50")
VIDEO = ("--cp", "2")  # the tiny Wan 2.1 over a cp axis, as tests/distributed/test_serve_video.py serves it
WAYS = {  # name: (what the clients send, server flags, ranks)
    "images": ("images", ("--max-batch", "1"), 2),
    "images batched": ("images", BATCH, 2),
    "images replicas": ("images", ("--replicas", "2"), 4),
    "images replicas batched": ("images", ("--replicas", "2", *BATCH), 4),
    "videos": ("videos", (*VIDEO, "--max-batch", "1"), 2),
    "videos batched": ("videos", (*VIDEO, *BATCH), 2),
    "videos replicas": ("videos", (*VIDEO, "--replicas", "2"), 4),
    "videos replicas batched": ("videos", (*VIDEO, "--replicas", "2", *BATCH), 4),
}
REPLICA_LINE = r"dtp serve: (?:replica (\d+): )?(?:request|batch of) \d+"  # one line per pipeline call
LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "dtp"]
POLL_S = 0.25  # how often a video client asks for its job's status


def body(seed: int) -> dict:
    size = SIZES[seed % len(SIZES)]
    return {"prompt": "a cat", "seed": seed, "size": f"{size}x{size}", "num_inference_steps": STEPS}


def image_client(url: str):
    """One synchronous image request: (status, seconds, the image's bytes or None)."""
    import httpx

    def one(seed: int):
        start = time.perf_counter()
        answer = httpx.post(f"{url}/v1/images/generations", json=body(seed), timeout=600)
        image = base64.b64decode(answer.json()["data"][0]["b64_json"]) if answer.status_code == 200 else None
        return answer.status_code, time.perf_counter() - start, image

    return one


def video_client(url: str):
    """One video job, as OpenAI's client does it: POST /v1/videos, poll until it finishes, download the mp4.
    (status: 200 when completed, else the failing answer's code or -1 for a failed job; seconds from the POST to
    the finished status; the mp4's bytes or None)."""
    import httpx

    def one(seed: int):
        start = time.perf_counter()
        with httpx.Client(base_url=url, timeout=600) as client:
            created = client.post("/v1/videos", json={**body(seed), "num_frames": FRAMES, "fps": 8})
            if created.status_code != 200:
                return created.status_code, time.perf_counter() - start, None
            video_id = created.json()["id"]
            while (status := client.get(f"/v1/videos/{video_id}").json()["status"]) in ("queued", "in_progress"):
                time.sleep(POLL_S)
            seconds = time.perf_counter() - start
            if status != "completed":
                return -1, seconds, None
            content = client.get(f"/v1/videos/{video_id}/content")
            return content.status_code, seconds, content.content if content.status_code == 200 else None

    return one


def load(url: str, kind: str, requests: int, clients: int) -> dict:
    one = (image_client if kind == "images" else video_client)(url)
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    latencies = sorted(seconds for _, seconds, _ in answers)
    outputs = [hashlib.sha256(output).hexdigest() for _, _, output in answers if output is not None]
    return {
        "requests": requests,
        "clients": clients,
        "ok": sum(code == 200 for code, _, _ in answers),
        "lost": sum(code != 200 for code, _, _ in answers),
        "distinct_outputs": len(set(outputs)),
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
    parser.add_argument("--video-requests", type=int, default=None, help="requests of the video ways (--requests)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--runs", type=int, default=2, help="back-to-back `dtp run` launches")
    parser.add_argument("--ways", nargs="+", choices=list(WAYS), default=list(WAYS), help="the ways to measure")
    args = parser.parse_args()
    args.video_requests = args.requests if args.video_requests is None else args.video_requests
    results = RESULTS if args.ways == list(WAYS) else RESULTS.with_name("serve_load_partial.json")
    ways, runs = {}, None
    with tempfile.TemporaryDirectory(prefix="dtp-serve-load-") as tmp:
        folder = Path(tmp)
        models = _models(folder, {WAYS[name][0] for name in args.ways})
        for name in args.ways:
            print(f"{name} ...", file=sys.stderr, flush=True)
            ways[name] = serve_way(name, models, folder / f"server{len(ways)}.log", args)
            print(f"{name}: {json.dumps(ways[name])}", file=sys.stderr, flush=True)
        if args.runs:
            runs = back_to_back(_models(folder, {"images"})["images"], args.runs, folder)
    result = {
        "pipeline": f"tiny FLUX.1 (images) and tiny Wan 2.1 ({FRAMES}-frame videos, cp=2), 32x32 and 16x16, "
        f"{STEPS} steps, fp32, gloo ranks (CPU)",
        "serve": ways,
        "dtp_run": runs,
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=1) + "\n")
    table = report(result, args)
    results.with_suffix(".md").write_text(table)
    print(table + f"wrote {results} and {results.with_suffix('.md')}")


def _models(folder: Path, kinds: set) -> dict:
    from dtp.families.pipelines import tiny_checkpoint
    from dtp.testing.conditioned_pipelines import tiny_wan_video_pipeline

    models = {}
    if "images" in kinds:
        models["images"] = tiny_checkpoint("flux", root=folder)
    if "videos" in kinds:
        models["videos"] = folder / "wan"
        if not (models["videos"] / "model_index.json").exists():
            tiny_wan_video_pipeline().save_pretrained(models["videos"])
    return models


def serve_way(name: str, models: dict, log: Path, args) -> dict:
    """One server of `name`'s flags, `args.requests` requests from `args.clients` clients; what the log and the
    answers say (lost, duplicated, latency, throughput, batches, pipeline calls per replica)."""
    from dtp.testing.serving import serving

    kind, flags, ranks = WAYS[name]
    requests = args.requests if kind == "images" else args.video_requests
    with serving(models[kind], log, *flags, nproc=ranks) as server:
        served = load(server.url, kind, requests, args.clients)
        if kind == "videos":  # every job accepted is in the store once, completed
            listed = server.client.get("/v1/videos", params={"limit": 10 * requests}).json()["data"]
            served["jobs_listed"] = len(listed)
            served["jobs_completed"] = sum(v["status"] == "completed" for v in listed)
    text = log.read_text()
    single = len(re.findall(r"dtp serve: (?:replica \d+: )?request \d+: .* ok", text))
    batched = [int(n) for n in re.findall(r"dtp serve: (?:replica \d+: )?batch of (\d+) .* ok", text)]
    served["kind"], served["flags"], served["ranks"] = kind, " ".join(flags), ranks
    served["by_replica"] = {
        replica or "0": n for replica, n in collections.Counter(re.findall(REPLICA_LINE, text)).items()
    }
    generated = single + sum(batched)
    served["generated_by_server"] = generated
    served["pipeline_calls"] = single + len(batched)
    served["mean_batch"] = generated / max(1, served["pipeline_calls"])
    served["duplicated"] = (served["ok"] - served["distinct_outputs"]) + max(0, generated - requests)
    if kind == "videos":
        served["duplicated"] += max(0, served["jobs_listed"] - requests)
        served["lost"] = max(served["lost"], requests - served["jobs_completed"])
    return served


def report(result: dict, args) -> str:
    ways, runs = result["serve"], result["dtp_run"]
    picked = "" if list(ways) == list(WAYS) else " --ways " + " ".join(f'"{name}"' for name in ways)
    lines = [
        f"`python benchmarks/serve_load.py --requests {args.requests} --video-requests {args.video_requests} "
        f"--clients {args.clients} --runs {args.runs}{picked}`: {result['pipeline']}.",
        "",
        "| way | flags | ranks | requests | lost | duplicated | mean batch | median s | p99 s | per second |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, served in ways.items():
        lines.append(
            f"| {name} | `{served['flags']}` | {served['ranks']} | {served['requests']} | {served['lost']} "
            f"| {served['duplicated']} | {served['mean_batch']:.2f} | {served['median_latency_s']:.2f} "
            f"| {served['p99_latency_s']:.2f} | {served['throughput_per_s']:.2f} |"
        )
    if runs:
        lines.append(
            f"| back-to-back dtp run (image) | - | 2 | {runs['runs']} | 0 | 0 | 1 | {runs['median_s']:.2f} | - "
            f"| {runs['throughput_per_s']:.3f} |"
        )
    lines.append("")
    throughput = {name: served["throughput_per_s"] for name, served in ways.items()}
    for kind in ("images", "videos"):
        for base, other, what in (
            (kind, f"{kind} batched", "batching on / off"),
            (kind, f"{kind} replicas", "2 replicas (4 ranks) / 1 (2 ranks)"),
            (f"{kind} replicas", f"{kind} replicas batched", "batching on / off with 2 replicas"),
        ):
            if base in throughput and other in throughput:
                lines.append(f"- {kind}: {what}: {throughput[other] / throughput[base]:.2f}x the throughput.")
    for name, served in ways.items():
        if served["ranks"] == 4:
            by_replica = ", ".join(f"replica {k}: {n}" for k, n in sorted(served["by_replica"].items()))
            lines.append(f"- {name}: pipeline calls per replica: {by_replica}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
