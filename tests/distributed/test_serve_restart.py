"""A rank SIGKILLed while a video job runs (2 gloo ranks, tiny Wan 2.1, cp=2, `--state-dir`, real sockets, the
official `openai` client, nothing mocked); nothing accepted is lost:

- under `torchrun --max-restarts 1`, rank 1 or rank 0 (the HTTP one) killed: torchrun brings the server back,
  `/health` turns 200 again, the interrupted job runs again and completes, and so do the two queued behind it; the
  launcher never exits. The server's log names the restart (`3 job(s) from ... queued again`).
- under `torchrun --max-restarts 0`, rank 0 killed: the launcher ends (non-zero); the server started again by hand
  with the same `--state-dir` runs the interrupted job and the two queued behind it.

Both list exactly the three jobs accepted afterwards, each completed, the interrupted one on its second attempt.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import httpx
import openai
import pytest

from dtp.testing.conditioned_pipelines import tiny_wan_video_pipeline
from dtp.testing.serving import rank_of, rank_processes, serving

# full: the default run covers a dying rank and a restart with the same --state-dir (test_serve_video.py); these
# add SIGKILL and torchrun's own restart (one server and its reload: about 3.5 min each on the busy 2-core machine)
pytestmark = [pytest.mark.full, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]
JOB = {"seed": 4, "num_inference_steps": 12, "num_frames": 5, "fps": 8}
BACK_S = 300  # the restart reloads the pipeline on a busy 2-core machine
ENDED_S = 60  # --max-restarts 0: the launcher ends this soon after a rank is killed
DONE_S = 180  # the three jobs (12 steps each: about 4 s) run once the server is back


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


def _submit_and_kill(server, rank: int) -> list:
    """A job running and two queued behind it; `rank` SIGKILLed once the first has made progress. The jobs."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    running = client.videos.create(prompt="a cat", size="16x16", extra_body=JOB)
    queued = [client.videos.create(prompt=p, size="16x16", extra_body=JOB) for p in ("a dog", "a bird")]
    _wait(lambda: client.videos.retrieve(running.id).progress > 0, 120, "progress")
    assert [client.videos.retrieve(v.id).status for v in queued] == ["queued", "queued"]
    (victim,) = [pid for pid in rank_processes(server) if rank_of(pid) == rank]
    os.kill(victim, signal.SIGKILL)
    return [running, *queued]


def _assert_all_completed(server, accepted: list) -> None:
    """Every job accepted completes; the store lists exactly them; the first ran twice (the log says so)."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

    def finished(video_id: str) -> str | None:
        status = client.videos.retrieve(video_id).status
        return None if status in ("queued", "in_progress") else status

    statuses = [_wait(lambda v=v: finished(v.id), DONE_S, f"end of {v.id}") for v in accepted]  # not a hang
    assert statuses == ["completed"] * 3, [client.videos.retrieve(v.id) for v in accepted]
    assert {v.id: v.status for v in client.videos.list()} == {v.id: "completed" for v in accepted}
    assert "3 job(s) from" in server.log.read_text()


def _attempts(state) -> dict:
    """{job id: attempts} from the job store (read once the server has stopped)."""
    with sqlite3.connect(state / "jobs.sqlite3") as db:
        return dict(db.execute("SELECT id, attempts FROM jobs"))


@pytest.mark.parametrize("victim", [1, 0])
def test_a_rank_killed_during_a_job_under_max_restarts_loses_nothing(tmp_path, victim):
    model_dir = tmp_path / "wan"
    tiny_wan_video_pipeline().save_pretrained(model_dir)
    options = ("--cp", "2", "--state-dir", str(tmp_path / "state"))
    with serving(model_dir, tmp_path / "server.log", *options, launch=("--max-restarts", "1")) as server:
        accepted = _submit_and_kill(server, victim)
        _wait(lambda: "queued again" in server.log.read_text(), BACK_S, "restart")
        _wait(lambda: server.client.get("/health").status_code == 200, BACK_S, "health")
        _assert_all_completed(server, accepted)
        assert server.process.poll() is None  # the launcher itself never ended
    assert _attempts(tmp_path / "state") == {v.id: n for v, n in zip(accepted, (2, 1, 1), strict=True)}


def test_rank_0_killed_under_max_restarts_0_then_restarted_by_hand_loses_nothing(tmp_path):
    model_dir = tmp_path / "wan"
    tiny_wan_video_pipeline().save_pretrained(model_dir)
    options = ("--cp", "2", "--state-dir", str(tmp_path / "state"))
    with serving(model_dir, tmp_path / "server.log", *options, launch=("--max-restarts", "0")) as server:
        accepted = _submit_and_kill(server, 0)
        code = server.process.wait(timeout=ENDED_S)
    assert code != 0, code
    assert "queued again" not in server.log.read_text()
    with serving(model_dir, tmp_path / "again.log", *options) as server:  # the same --state-dir
        _assert_all_completed(server, accepted)
    assert _attempts(tmp_path / "state") == {v.id: n for v, n in zip(accepted, (2, 1, 1), strict=True)}
