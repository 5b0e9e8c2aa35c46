"""`stream: true` on /v1/images/generations and /v1/images/edits: server-sent events of the step progress, then the
image, as OpenAI's image API streams (`openai`'s `client.images.generate(..., stream=True)` iterates them).

    response = stream_job(jobs, request, output, prefix="image_generation")   # None when the queue is full (503)

Events (`event: TYPE` and `data: JSON`), TYPE prefixed "image_generation." (or "image_edit." for an edit):

    progress    {"type", "created_at", "step", "steps", "progress"}   after each denoising step: step 1 ... steps,
                                                                        progress the percent (the video object's)
    completed   OpenAI's ImageGenCompletedEvent: {"type", "created_at", "b64_json", "output_format", "size",
                "background": "opaque", "quality": "auto", "usage" (zeros: dtp counts no tokens)}, one per image
    error       {"type": "error", "error": {"message", "code": 500}} when the generation failed (the client raises)

"progress" is dtp's (OpenAI sends partial images instead; `partial_images` above 0 is a 400, `api`): the client
yields it as an event whose `.type` says so. The steps come from the worker's per-step callback (`Job.on_step`, the
path of /health's progress), so a streamed request may run in a batch with others; on replica 0 only
(`replicas`). A client that leaves mid-stream leaves its job running, as a non-streamed one.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time

from fastapi.responses import StreamingResponse

from .jobs import JobFailed, JobQueue, Output

DONE = None


def stream_job(jobs: JobQueue, request, output: Output, *, prefix: str) -> StreamingResponse | None:
    """Queue `request` with a per-step callback; the response streams its events (None: the queue is full)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def on_step(step: int, steps: int | None) -> None:  # the lockstep thread: hand over to the event loop
        loop.call_soon_threadsafe(events.put_nowait, (step, steps))

    job = jobs.put(request, output=output, on_step=on_step)
    if job is None:
        return None
    # after the last step's event: one thread calls both, in order, and the loop keeps that order
    job.future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, DONE))
    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
    return StreamingResponse(_events(job, events, output, prefix), media_type="text/event-stream", headers=headers)


async def _events(job, events: asyncio.Queue, output: Output, prefix: str):
    while (item := await events.get()) is not DONE:
        step, steps = item
        percent = int(100 * step / steps) if steps else None
        yield _event(f"{prefix}.progress", {"step": step, "steps": steps, "progress": percent})
    try:
        result = job.future.result()
    except JobFailed as exc:
        yield _event("error", {"error": {"message": f"the generation failed: {exc}", "code": 500}})
        return
    for data in result.outputs:
        completed = {
            "b64_json": base64.b64encode(data).decode(),
            "output_format": output.format,
            "size": _size(data),
            "background": "opaque",
            "quality": "auto",
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "total_tokens": 0,
                "input_tokens_details": {"image_tokens": 0, "text_tokens": 0},
            },
        }
        yield _event(f"{prefix}.completed", completed)


def _size(data: bytes) -> str:
    from PIL import Image

    width, height = Image.open(io.BytesIO(data)).size  # reads the header only
    return f"{width}x{height}"


def _event(kind: str, fields: dict) -> str:
    body = {"type": kind, "created_at": int(time.time()), **fields}
    return f"event: {kind}\ndata: {json.dumps(body)}\n\n"
