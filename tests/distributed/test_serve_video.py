"""`dtp serve` on a video pipeline: `torchrun --nproc-per-node 2 -m dtp serve --cp 2` on the tiny Wan 2.1
text-to-video pipeline; a request with num_frames answers an mp4 with those frames, equal to the one-process
`dtp run` of the same prompt and seed (both mp4s decoded: the same pixels up to fp32 noise go through the same
encoder: within one level of 255)."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np

from dtp.pipeline.outputs import read_video
from dtp.testing.conditioned_pipelines import tiny_wan_video_pipeline
from dtp.tools.cli import main

FRAMES = 5
BODY = {"prompt": "a cat", "seed": 4, "size": "16x16", "num_inference_steps": 2, "num_frames": FRAMES, "fps": 8}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_video_request_answers_the_dtp_run_mp4(tmp_path):
    model_dir = tmp_path / "wan"
    tiny_wan_video_pipeline().save_pretrained(model_dir)
    port = free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "dtp"]
    command += ["serve", "--model-dir", str(model_dir), "--port", str(port), "--dtype", "fp32", "--cp", "2"]
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
        _wait_healthy(client, server, log)
        assert client.get("/v1/models").json()["data"][0]["kind"] == "video"
        answer = client.post("/v1/images/generations", json=BODY)
        assert answer.status_code == 200, answer.text
        assert answer.json()["output_format"] == "mp4"
        (tmp_path / "served.mp4").write_bytes(base64.b64decode(answer.json()["data"][0]["b64_json"]))
        bad = client.post("/v1/images/generations", json={**BODY, "num_frames": 4})  # not 2k + 1
        assert bad.status_code == 400 and "2k + 1" in bad.json()["error"]["message"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    argv = ["run", "--model-dir", str(model_dir), "--prompt", "a cat", "--seed", "4", "--height", "16", "--width"]
    argv += ["16", "--steps", "2", "--frames", str(FRAMES), "--fps", "8", "--dtype", "fp32"]
    assert main([*argv, "--output", str(tmp_path / "run.mp4")]) == 0
    served, reference = read_video(tmp_path / "served.mp4"), read_video(tmp_path / "run.mp4")
    assert served.shape == (FRAMES, 16, 16, 3)
    assert np.abs(served.astype(int) - reference.astype(int)).max() <= 1


def _wait_healthy(client, server, log) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise AssertionError("the server did not become healthy in 300 s")
