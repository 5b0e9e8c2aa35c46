"""`dtp serve` on a video pipeline: `torchrun --nproc-per-node 2 -m dtp serve --cp 2 --state-dir DIR` on the tiny
Wan 2.1 text-to-video pipeline, real sockets, the official `openai` client, nothing mocked.

- A video request (`/v1/images/generations` with num_frames) and a video job (`client.videos.create_and_poll`, then
  `download_content`) each answer the mp4 of the one-process `dtp run` of the same prompt and seed (both mp4s
  decoded: the same pixels up to fp32 noise through the same encoder: within one level of 255).
- 14 kinds of bad job request (and job id) get a 4xx with a JSON body.
- A job the ranks cannot finish: rank 1 raises as its transformer starts a 32 x 32 job (`serve_fault.py`) while rank
  0 waits inside the first cp collective. The peer-failure watcher (`dtp.serve.peers`, grace lowered to 4 s) ends
  every rank long before the process group's --timeout; the image request queued behind it gets a 500, a job
  queued behind it stays queued, a job cancelled while queued is gone.
- The server started again with the same `--state-dir` (no fault now): the interrupted job runs again (its second
  attempt) and completes, so does the one queued behind it; nothing accepted is lost.
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from dtp.pipeline.outputs import read_video
from dtp.testing.conditioned_pipelines import tiny_wan_video_pipeline
from dtp.testing.serving import quiet_env, serving
from dtp.tools.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # openai marks videos.*

FAULT = Path(__file__).resolve().parent / "serve_fault.py"
FRAMES = 5
BODY = {"prompt": "a cat", "seed": 4, "size": "16x16", "num_inference_steps": 2, "num_frames": FRAMES, "fps": 8}
JOB = {"seed": 4, "num_inference_steps": 2, "num_frames": FRAMES, "fps": 8}  # extra_body of videos.create
GRACE_S, ENDED_S = 4, 60  # the watcher's grace here; the bound on job start -> every rank gone (--timeout is 600)

BAD_JOBS = {  # name -> (JSON body or multipart files, the status)
    "not JSON": (b"{prompt: a cat", 400),
    "not an object": (b'["a cat"]', 400),
    "no prompt": ({"seconds": "4"}, 400),
    "unknown field": ({"prompt": "a cat", "colour": "red"}, 400),
    "seconds not a number": ({"prompt": "a cat", "seconds": "four"}, 400),
    "seconds and num_frames": ({"prompt": "a cat", "seconds": "4", "num_frames": 5}, 400),
    "size not WxH": ({"prompt": "a cat", "size": "big"}, 400),
    "size the pipeline cannot take": ({"prompt": "a cat", "size": "33x32"}, 400),
    "frames not 2k + 1": ({"prompt": "a cat", "num_frames": 4}, 400),
    "two videos": ({"prompt": "a cat", "n": 2}, 400),
    "another model": ({"prompt": "a cat", "model": "sora-2"}, 400),
    "input_reference to a text-to-video pipeline": ({"prompt": "a cat", "input_reference": b"\x89PNG..."}, 400),
}


def _bad_job_requests(client: httpx.Client) -> None:
    for name, (body, status) in BAD_JOBS.items():
        if isinstance(body, bytes):
            answer = client.post("/v1/videos", content=body, headers={"content-type": "application/json"})
        elif any(isinstance(v, bytes) for v in body.values()):  # a multipart upload, as openai's client sends it
            files = {k: ("f.png", v, "image/png") for k, v in body.items() if isinstance(v, bytes)}
            answer = client.post("/v1/videos", data={k: v for k, v in body.items() if k not in files}, files=files)
        else:
            answer = client.post("/v1/videos", json=body)
        assert answer.status_code == status, (name, answer.status_code, answer.text)
        assert isinstance(answer.json()["error"]["message"], str), name
    assert client.get("/v1/videos/video_nope").status_code == 404
    assert client.delete("/v1/videos/video_nope").status_code == 404
    assert client.get("/v1/videos/video_nope/content").status_code == 404
    assert client.get("/v1/videos", params={"order": "sideways"}).status_code == 400


def _wait_status(client, video_id: str, status: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while client.videos.retrieve(video_id).status != status:
        assert time.monotonic() < deadline, client.videos.retrieve(video_id)
        time.sleep(0.1)


@pytest.mark.full  # suite time (44 s): jobs and the store by default in tests/unit/test_serve_jobs.py
def test_video_requests_and_jobs_equal_dtp_run_and_survive_a_dying_rank(tmp_path):
    model_dir, state = tmp_path / "wan", tmp_path / "state"
    tiny_wan_video_pipeline().save_pretrained(model_dir)
    env = quiet_env(DTP_TEST_STUCK_RANK="1", DTP_TEST_STUCK_WIDTH="16", DTP_TEST_GRACE_S=str(GRACE_S))
    options = ("--cp", "2", "--state-dir", str(state))
    with serving(model_dir, tmp_path / "server.log", *options, script=FAULT, env=env) as server:
        assert server.client.get("/v1/models").json()["data"][0]["kind"] == "video"
        answer = server.client.post("/v1/images/generations", json=BODY)
        assert answer.status_code == 200, answer.text
        assert answer.json()["output_format"] == "mp4"
        (tmp_path / "served.mp4").write_bytes(base64.b64decode(answer.json()["data"][0]["b64_json"]))
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        job = client.videos.create_and_poll(prompt="a cat", size="16x16", extra_body=JOB, poll_interval_ms=100)
        assert (job.status, job.progress, job.size, job.seconds) == ("completed", 100, "16x16", "0.625"), job
        (tmp_path / "job.mp4").write_bytes(client.videos.download_content(job.id).read())
        _bad_job_requests(server.client)
        stuck = client.videos.create(prompt="a dog", size="32x32", extra_body=JOB)  # rank 1 raises in it
        _wait_status(client, stuck.id, "in_progress")
        behind = client.videos.create(prompt="a bird", size="16x16", extra_body={**JOB, "seed": 5})
        cancelled = client.videos.create(prompt="a fish", size="16x16", extra_body=JOB)
        assert client.videos.delete(cancelled.id).deleted is True
        assert server.client.get(f"/v1/videos/{behind.id}/content").status_code == 409  # not made yet
        image = {}
        waiter = threading.Thread(
            target=lambda: image.update(answer=server.client.post("/v1/images/generations", json=BODY))
        )
        waiter.start()
        code = server.process.wait(timeout=ENDED_S)
        waiter.join(timeout=ENDED_S)
    log = server.log.read_text()
    assert code != 0, code
    assert "rank 1 failed request 3 (RuntimeError: planted failure in rank 1's transformer)" in log, log[-3000:]
    assert image["answer"].status_code == 500 and "stopping" in image["answer"].json()["error"]["message"]

    with serving(model_dir, tmp_path / "again.log", *options) as server:  # the same state, no fault
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        finished = [client.videos.poll(v.id, poll_interval_ms=100) for v in (stuck, behind)]
        assert [v.status for v in finished] == ["completed", "completed"], finished
        assert server.client.get(f"/v1/videos/{cancelled.id}").status_code == 404
        listed = {v.id: v.status for v in client.videos.list()}
        assert listed == {job.id: "completed", stuck.id: "completed", behind.id: "completed"}, listed
        assert read_video_bytes(client.videos.download_content(behind.id).read(), tmp_path).shape[0] == FRAMES
        assert client.videos.delete(job.id).deleted is True
        assert server.client.get(f"/v1/videos/{job.id}/content").status_code == 404
    assert "2 job(s) from" in server.log.read_text()
    _assert_equals_dtp_run(model_dir, tmp_path)


def read_video_bytes(data: bytes, folder: Path) -> np.ndarray:
    path = folder / "downloaded.mp4"
    path.write_bytes(data)
    return read_video(path)


def _assert_equals_dtp_run(model_dir, tmp_path) -> None:
    argv = ["run", "--model-dir", str(model_dir), "--prompt", "a cat", "--seed", "4", "--height", "16", "--width"]
    argv += ["16", "--steps", "2", "--frames", str(FRAMES), "--fps", "8", "--dtype", "fp32"]
    assert main([*argv, "--output", str(tmp_path / "run.mp4")]) == 0
    reference = read_video(tmp_path / "run.mp4")
    for name in ("served.mp4", "job.mp4"):
        served = read_video(tmp_path / name)
        assert served.shape == (FRAMES, 16, 16, 3), name
        assert np.abs(served.astype(int) - reference.astype(int)).max() <= 1, name
