"""`dtp serve` on a video pipeline: `torchrun --nproc-per-node 2 -m dtp serve --cp 2` on the tiny Wan 2.1
text-to-video pipeline; a request with num_frames answers an mp4 with those frames, equal to the one-process
`dtp run` of the same prompt and seed (both mp4s decoded: the same pixels up to fp32 noise go through the same
encoder: within one level of 255).

The same server (through `serve_fault.py`) then meets a failure that no agreement can catch: rank 1 raises as its
transformer starts a 32 x 32 request, while rank 0 waits inside the first cp collective. The peer-failure watcher
(`dtp.serve.peers`, grace lowered to 2 s) answers the request with a 500 and ends every rank, long before the
process group's --timeout (measured: 6.1 s from the request to the launcher's exit on a busy 2-core machine;
without the watcher the request hangs past the test's 60 s bound: the negative control).
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import numpy as np

from dtp.pipeline.outputs import read_video
from dtp.testing.conditioned_pipelines import tiny_wan_video_pipeline
from dtp.testing.serving import quiet_env, serving
from dtp.tools.cli import main

FAULT = Path(__file__).resolve().parent / "serve_fault.py"
FRAMES = 5
BODY = {"prompt": "a cat", "seed": 4, "size": "16x16", "num_inference_steps": 2, "num_frames": FRAMES, "fps": 8}
STUCK = {**BODY, "size": "32x32"}  # latents 16 wide: rank 1 raises in its transformer (serve_fault.py)
GRACE_S, ENDED_S = 2, 60  # the watcher's grace here; the bound on request -> every rank gone (--timeout is 600)


def test_a_video_request_answers_the_dtp_run_mp4_and_a_stuck_rank_ends_the_server(tmp_path):
    model_dir = tmp_path / "wan"
    tiny_wan_video_pipeline().save_pretrained(model_dir)
    env = quiet_env(DTP_TEST_STUCK_RANK="1", DTP_TEST_STUCK_WIDTH="16", DTP_TEST_GRACE_S=str(GRACE_S))
    with serving(model_dir, tmp_path / "server.log", "--cp", "2", script=FAULT, env=env) as server:
        assert server.client.get("/v1/models").json()["data"][0]["kind"] == "video"
        answer = server.client.post("/v1/images/generations", json=BODY)
        assert answer.status_code == 200, answer.text
        assert answer.json()["output_format"] == "mp4"
        (tmp_path / "served.mp4").write_bytes(base64.b64decode(answer.json()["data"][0]["b64_json"]))
        bad = server.client.post("/v1/images/generations", json={**BODY, "num_frames": 4})  # not 2k + 1
        assert bad.status_code == 400 and "2k + 1" in bad.json()["error"]["message"]
        start = time.monotonic()
        stuck = server.client.post("/v1/images/generations", json=STUCK, timeout=ENDED_S)
        code = server.process.wait(timeout=ENDED_S)
        ended = time.monotonic() - start
    log = server.log.read_text()
    assert stuck.status_code == 500 and "every rank ends" in stuck.json()["error"]["message"], stuck.text
    assert code != 0 and ended < ENDED_S, (code, ended)
    assert "rank 1 failed request 2 (RuntimeError: planted failure in rank 1's transformer)" in log, log[-3000:]
    print(f"stuck request -> launcher exit {code}: {ended:.1f} s")
    _assert_equals_dtp_run(model_dir, tmp_path)


def _assert_equals_dtp_run(model_dir, tmp_path) -> None:
    argv = ["run", "--model-dir", str(model_dir), "--prompt", "a cat", "--seed", "4", "--height", "16", "--width"]
    argv += ["16", "--steps", "2", "--frames", str(FRAMES), "--fps", "8", "--dtype", "fp32"]
    assert main([*argv, "--output", str(tmp_path / "run.mp4")]) == 0
    served, reference = read_video(tmp_path / "served.mp4"), read_video(tmp_path / "run.mp4")
    assert served.shape == (FRAMES, 16, 16, 3)
    assert np.abs(served.astype(int) - reference.astype(int)).max() <= 1
