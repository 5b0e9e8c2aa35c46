"""A rank SIGKILLed while a video job runs, under `torchrun --max-restarts 1` (2 gloo ranks, tiny Wan 2.1, cp=2,
`--state-dir`, real sockets, the official `openai` client, nothing mocked): torchrun brings the server back,
`/health` turns 200 again, the interrupted job runs again and completes, and so do the two queued behind it;
nothing accepted is lost. The server's log names the restart (`3 job(s) from ... queued again`)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import openai
import pytest

from dtp.testing.conditioned_pipelines import tiny_wan_video_pipeline
from dtp.testing.serving import rank_of, rank_processes, serving

# full: the default run covers a dying rank and a restart with the same --state-dir (test_serve_video.py); this adds
# torchrun's own restart (one server and its reload: about 3.5 min on the busy 2-core machine)
pytestmark = [pytest.mark.full, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]
JOB = {"seed": 4, "num_inference_steps": 12, "num_frames": 5, "fps": 8}
BACK_S = 300  # the restart reloads the pipeline on a busy 2-core machine


def _wait(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (httpx.TransportError, openai.APIConnectionError):
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"no {what} in {timeout_s} s")


def test_a_rank_killed_during_a_job_under_max_restarts_loses_nothing(tmp_path):
    model_dir = tmp_path / "wan"
    tiny_wan_video_pipeline().save_pretrained(model_dir)
    options = ("--cp", "2", "--state-dir", str(tmp_path / "state"))
    with serving(model_dir, tmp_path / "server.log", *options, launch=("--max-restarts", "1")) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        running = client.videos.create(prompt="a cat", size="16x16", extra_body=JOB)
        queued = [client.videos.create(prompt=p, size="16x16", extra_body=JOB) for p in ("a dog", "a bird")]
        _wait(lambda: client.videos.retrieve(running.id).progress > 0, 120, "progress")
        (victim,) = [pid for pid in rank_processes(server) if rank_of(pid) == 1]
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: "queued again" in server.log.read_text(), BACK_S, "restart")
        _wait(lambda: server.client.get("/health").status_code == 200, BACK_S, "health")
        finished = [client.videos.poll(v.id, poll_interval_ms=200) for v in (running, *queued)]
        assert server.process.poll() is None  # the launcher itself never ended
    assert [v.status for v in finished] == ["completed"] * 3, finished
    assert "3 job(s) from" in server.log.read_text()
