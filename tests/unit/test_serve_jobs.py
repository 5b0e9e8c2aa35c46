"""The pieces of `dtp serve`'s job path that need no server: the SQLite job store across restarts (a reopened
store is what a restarted rank 0 sees), the queue's cancel and bound, the multipart body OpenAI's own client sends
(captured from the real client through an httpx mock transport), and `seconds` -> frame counts."""

from __future__ import annotations

import io

import httpx
import numpy as np
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from dtp.errors import PlanError
from dtp.pipeline.request import Request
from dtp.serve.api import frames_of, read_body
from dtp.serve.jobs import JobQueue, Output, encode_as
from dtp.serve.store import JobStore


def _add(store: JobStore, id: str) -> None:
    store.add(id, "video", {"prompt": id}, seconds="1", size="16x16", model="m")


def test_a_job_interrupted_is_queued_again_until_max_attempts_then_failed_with_the_reason(tmp_path):
    store = JobStore(tmp_path, max_attempts=2)
    _add(store, "a")
    _add(store, "b")
    store.start("a")
    store.interrupt("a", "rank 1 died")
    store = JobStore(tmp_path, max_attempts=2)  # the restart
    assert [(j["id"], j["attempts"]) for j in store.resume()] == [("a", 1), ("b", 0)]
    store.start("a")  # the second attempt dies too
    store = JobStore(tmp_path, max_attempts=2)
    assert [j["id"] for j in store.resume()] == ["b"]
    failed = store.get("a")
    assert failed["status"] == "failed"
    assert failed["error"] == "interrupted 2 times (--max-attempts 2): rank 1 died"


@settings(max_examples=25, deadline=None)
@given(attempts=st.lists(st.integers(0, 4), min_size=1, max_size=6), max_attempts=st.integers(1, 3))
def test_no_accepted_job_vanishes_across_a_restart(tmp_path_factory, attempts, max_attempts):
    """Each job started `attempts[i]` times and never finished: after a restart it is queued again exactly when it
    has attempts left, else failed with a message; every job is still there."""
    store = JobStore(tmp_path_factory.mktemp("state"), max_attempts=max_attempts)
    for i, started in enumerate(attempts):
        _add(store, f"j{i}")
        for _ in range(started):
            store.start(f"j{i}")
    store = JobStore(store.folder, max_attempts=max_attempts)
    queued = {job["id"] for job in store.resume()}
    for i, started in enumerate(attempts):
        job = store.get(f"j{i}")
        assert (f"j{i}" in queued) == (started < max_attempts)
        assert job["status"] == ("queued" if started < max_attempts else "failed")
        assert job["status"] == "queued" or job["error"].startswith(f"interrupted {started} times")


def test_cancel_delete_and_expiry(tmp_path):
    store = JobStore(tmp_path, keep_hours=1)
    for id in ("queued", "running", "done"):
        _add(store, id)
    store.start("running")
    store.start("done")
    store.complete("done", b"mp4 bytes")
    assert store.output("done").read_bytes() == b"mp4 bytes"
    assert not store.cancel("running") and not store.delete("running")  # 409: it runs
    assert store.cancel("queued") and store.get("queued") is None
    assert store.expire() == 0
    assert store.expire(now=store.get("done")["completed_at"] + 2 * 3600) == 1
    assert store.get("done") is None and not store.output("done").exists()


def test_the_queue_skips_a_cancelled_job_and_refuses_beyond_its_size():
    jobs = JobQueue(2)
    first, second = jobs.put(Request(prompt="a")), jobs.put(Request(prompt="b"))
    assert jobs.put(Request(prompt="c")) is None
    assert jobs.put(Request(prompt="c"), force=True) is not None  # a stored job after a restart
    first.cancelled = True
    assert jobs.get(timeout=0.1) is second


def _sent_by_openai(call) -> httpx.Request:
    """The HTTP request OpenAI's client sends for `call(client)` (its answer a dummy)."""
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"created": 0, "data": []})

    transport = httpx.MockTransport(answer)
    client = openai.OpenAI(base_url="http://x/v1", api_key="k", http_client=httpx.Client(transport=transport))
    call(client)
    return sent[0]


def test_the_multipart_body_of_openai_images_edit():
    png = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(png, format="PNG")
    extra = {"seed": 3, "num_inference_steps": 2, "guidance_scale": 3.5, "lora": {"style": 0.5}}
    request = _sent_by_openai(
        lambda c: c.images.edit(
            image=("in.png", png.getvalue(), "image/png"), prompt="a cat", size="32x32", output_compression=50,
            extra_body=extra,
        )
    )  # fmt: skip
    body = read_body(request.read(), request.headers["content-type"])
    assert body.pop("image") == png.getvalue()
    assert body == {"prompt": "a cat", "size": "32x32", "output_compression": 50, **extra}


def test_a_json_body_and_bad_bodies():
    request = _sent_by_openai(lambda c: c.images.generate(prompt="a cat", quality="high", extra_body={"seed": 1}))
    assert read_body(request.read(), request.headers["content-type"]) == {
        "prompt": "a cat",
        "quality": "high",
        "seed": 1,
    }
    for raw, kind in (
        (b"{", "application/json"),
        (b"[1]", "application/json"),
        (b"x", "multipart/form-data; boundary=b"),
    ):
        with pytest.raises(PlanError):
            read_body(raw, kind)
    form = b'--b\r\nContent-Disposition: form-data; name="seed"\r\n\r\nseven\r\n--b--\r\n'
    with pytest.raises(PlanError, match="'seed' must be a number"):
        read_body(form, "multipart/form-data; boundary=b")


@pytest.mark.parametrize(("seconds", "fps", "step", "frames"), [("4", 16, 4, 65), (1, 8, 2, 9), ("0.1", 16, 4, 5)])
def test_seconds_are_the_nearest_frame_count_the_pipeline_takes(seconds, fps, step, frames):
    assert frames_of(seconds, fps, step) == frames
    assert (frames - 1) % step == 0


def test_jpeg_and_webp_honour_output_compression():
    pixels = np.random.default_rng(0).random((32, 32, 3), dtype=np.float32)
    sizes = {c: len(encode_as(pixels, video=False, fps=1, output=Output("jpeg", c))) for c in (0, 90)}
    assert sizes[90] < sizes[0]  # more compression, fewer bytes
    assert encode_as(pixels, video=False, fps=1, output=Output("webp", 10))[:4] == b"RIFF"
