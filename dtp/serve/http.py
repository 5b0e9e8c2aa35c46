"""The HTTP face of `dtp serve`, on rank 0: FastAPI routes over the job queue (the `serve` extra).

    GET    /metrics                    Prometheus' text format (`metrics`; 501 without prometheus_client)
    GET    /health                     200 {"status": "ok", ...progress} once every rank has loaded, 503 while loading;
                                       with --replicas R > 1 also "replicas": [{replica, running, done, ...}]
    GET    /v1/models                  the loaded pipeline (OpenAI's list form), its kind and LoRA names
    POST   /v1/images/generations      OpenAI's body (every field its client sends; `api`) plus seed,
                                       num_inference_steps, negative_prompt, guidance_scale, true_cfg_scale,
                                       image (base64), num_frames, fps, lora {name: weight}
                                       -> {"created", "data": [{"b64_json"}], "output_format": "png" | ... | "mp4"}
                                       `stream: true`: text/event-stream, an event per step then the
                                       image (`sse`)
    POST   /v1/images/edits            the same as a multipart form with the image as a file (OpenAI's images.edit)
    POST   /v1/videos                  OpenAI's video job (JSON or multipart): answered at once, status "queued"
    GET    /v1/videos                  the jobs, OpenAI's cursor page (after, limit, order)
    GET    /v1/videos/{id}             status and progress (percent of the denoising steps)
    GET    /v1/videos/{id}/content     the mp4 once completed
    DELETE /v1/videos/{id}             cancels a queued job, removes a finished one (409 while it runs)

A request is checked here, before any rank sees it: bad JSON, unknown or wrong-typed fields, values dtp cannot
honour, sizes or frames the pipeline cannot take, unknown LoRA names -> 400 with {"error": {"message": ...}}; a full
queue -> 503; a generation that failed on any rank -> 500 with the ranks' messages. Video jobs live in the job store
(`store.JobStore`, SQLite under --state-dir) from the moment they are accepted. Imported only by `dtp serve`, once
it has checked that FastAPI is installed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from dataclasses import asdict

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from ..errors import PlanError
from ..pipeline.request import makes_video
from .api import Served, image_request, read_body, video_request
from .jobs import JobFailed, JobQueue, Output, Progress
from .metrics import Metrics
from .sse import stream_job
from .store import JobStore

LOADING = "the model is still loading; GET /health says when it is ready."


def error(status: int, message: str):
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def build_app(
    loaded: dict,
    jobs: JobQueue,
    progress: Progress,
    served: Served,
    *,
    store: JobStore,
    metrics: Metrics | None = None,
    replicas=None,
) -> FastAPI:
    """The routes; `loaded["pipe"]` is rank 0's pipeline once every rank has loaded (until then: 503s). `metrics`:
    None when prometheus_client is missing (/metrics answers 501). `replicas`: with --replicas R > 1, a callable
    giving each replica's state for /health (`replicas.Router.health`)."""
    app = FastAPI(title="dtp serve")
    model_id, loras = served.model_id, served.loras

    _status_routes(app, jobs, progress, metrics, replicas)

    @app.get("/v1/models")
    def models():
        if not progress.loaded:
            return error(503, LOADING)
        kind = "video" if makes_video(loaded["pipe"]) else "image"
        entry = {"id": model_id, "object": "model", "owned_by": "dtp", "kind": kind}
        return {"object": "list", "data": [{**entry, "loras": sorted(loras)}]}

    async def images(http: Request, *, edit: bool):
        if not progress.loaded:
            return error(503, LOADING)
        try:
            body = read_body(await http.body(), http.headers.get("content-type", ""))
            request, output, stream = image_request(body, loaded["pipe"], served, edit=edit)
        except PlanError as exc:
            return error(400, str(exc))
        if stream:  # server-sent events: each step, then the image (`sse`)
            response = stream_job(jobs, request, output, prefix="image_edit" if edit else "image_generation")
            return error(503, "the queue is full; retry later.") if response is None else response
        job = jobs.put(request, output=output)
        if job is None:
            return error(503, "the queue is full; retry later.")
        try:
            result = await asyncio.wrap_future(job.future)
        except JobFailed as exc:
            return error(500, f"the generation failed: {exc}")
        data = [{"b64_json": base64.b64encode(o).decode()} for o in result.outputs]
        return {"created": int(time.time()), "data": data, "output_format": output.format}

    @app.post("/v1/images/generations")
    async def generations(http: Request):
        return await images(http, edit=False)

    @app.post("/v1/images/edits")
    async def edits(http: Request):
        return await images(http, edit=True)

    _video_routes(app, loaded, jobs, progress, served, store)
    return app


def _status_routes(app: FastAPI, jobs: JobQueue, progress: Progress, metrics: Metrics | None, replicas) -> None:
    """The request counter (a middleware), GET /metrics and GET /health."""

    @app.middleware("http")
    async def count(http: Request, call_next):
        start = time.perf_counter()
        response = await call_next(http)
        if metrics is not None:
            endpoint = getattr(http.scope.get("route"), "path", "unmatched")
            metrics.answered(endpoint, response.status_code, time.perf_counter() - start)
        return response

    @app.get("/metrics")
    def prometheus():
        if metrics is None:
            return error(501, "/metrics needs prometheus_client: pip install 'dtp[metrics]'.")
        body, content_type = metrics.text()
        return Response(body, media_type=content_type)

    @app.get("/health")
    def health():
        state = {"status": "ok" if progress.loaded else "loading", **asdict(progress), "waiting": jobs.waiting()}
        if replicas is not None:  # the counts are every replica's; "job", "step", ... replica 0's
            state["replicas"] = replicas(progress)
            for count in ("done", "failed", "batches"):
                state[count] = sum(replica[count] for replica in state["replicas"])
        return JSONResponse(state, status_code=200 if progress.loaded else 503)


def _video_routes(app: FastAPI, loaded: dict, jobs: JobQueue, progress: Progress, served: Served, store: JobStore):
    """OpenAI's video job API: create and list (`_video_job_routes`: one job's state, content, delete)."""
    model_id = served.model_id

    @app.post("/v1/videos")
    async def create_video(http: Request):
        if not progress.loaded:
            return error(503, LOADING)
        try:
            body = read_body(await http.body(), http.headers.get("content-type", ""))
            body = {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in body.items()}
            request, seconds = video_request(body, loaded["pipe"], served)
        except PlanError as exc:
            return error(400, str(exc))
        if jobs.waiting() >= jobs.size:
            return error(503, "the queue is full; retry later.")
        store.expire()
        size = f"{request.width}x{request.height}" if request.width else "default"
        row = store.add(f"video_{uuid.uuid4().hex}", "video", body, seconds=seconds, size=size, model=model_id)
        queue_stored(store, jobs, row["id"], request)
        return video_object(row, progress, store)

    @app.get("/v1/videos")
    def list_videos(after: str | None = None, limit: int = 20, order: str = "desc"):
        if order not in ("asc", "desc") or limit < 1:
            return error(400, f"order {order!r} / limit {limit}: order is 'asc' or 'desc', limit at least 1.")
        rows = store.list()
        rows = rows[::-1] if order == "desc" else rows
        ids = [row["id"] for row in rows]
        if after is not None:
            if after not in ids:
                return error(404, f"after {after!r}: no such video.")
            rows = rows[ids.index(after) + 1 :]
        page = [video_object(row, progress, store) for row in rows[:limit]]
        first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
        return {"object": "list", "data": page, "first_id": first, "last_id": last, "has_more": len(rows) > limit}

    _video_job_routes(app, jobs, progress, store)


def _video_job_routes(app: FastAPI, jobs: JobQueue, progress: Progress, store: JobStore):
    """GET /v1/videos/{id}, GET /v1/videos/{id}/content, DELETE /v1/videos/{id}."""

    @app.get("/v1/videos/{video_id}")
    def retrieve_video(video_id: str):
        row = store.get(video_id)
        if row is None:
            return error(404, f"no video {video_id!r} (never created, deleted, or expired).")
        return video_object(row, progress, store)

    @app.get("/v1/videos/{video_id}/content")
    def video_content(video_id: str, variant: str = "video"):
        row = store.get(video_id)
        if row is None:
            return error(404, f"no video {video_id!r} (never created, deleted, or expired).")
        if variant != "video":
            return error(400, f"variant {variant!r}: dtp keeps the video only (no thumbnail or spritesheet).")
        if row["status"] != "completed":
            return error(409, f"video {video_id!r} is {row['status']}; its content exists once it is completed.")
        return FileResponse(store.output(video_id), media_type="video/mp4")

    @app.delete("/v1/videos/{video_id}")
    def delete_video(video_id: str):
        row = store.get(video_id)
        if row is None:
            return error(404, f"no video {video_id!r} (never created, deleted, or expired).")
        if row["status"] == "queued" and store.cancel(video_id):
            job = jobs.records.pop(video_id, None)
            if job is not None:
                job.cancelled = True
        elif not store.delete(video_id):
            return error(409, f"video {video_id!r} is {row['status']}; delete it once it has finished.")
        return {"id": video_id, "object": "video.deleted", "deleted": True}


def queue_stored(store: JobStore, jobs: JobQueue, video_id: str, request):
    """Queue a stored job: the store follows it (in progress, completed with its mp4, failed with the reason)."""

    def done(future) -> None:
        jobs.records.pop(video_id, None)
        if future.cancelled():
            return
        exception = future.exception()
        if exception is not None:
            store.fail(video_id, f"the generation failed: {exception}")
        else:
            store.complete(video_id, future.result().outputs[0])

    def start() -> None:
        jobs.records.pop(video_id, None)
        store.start(video_id)

    job = jobs.put(
        request,
        force=True,  # the store holds it already: the queue's bound was checked before `store.add`
        output=Output("mp4"),
        record=video_id,
        on_start=start,
        on_interrupt=lambda message: store.interrupt(video_id, message),
    )
    jobs.records[video_id] = job
    job.future.add_done_callback(done)
    return job


def resume_stored(store: JobStore, jobs: JobQueue, pipe, served: Served) -> int:
    """At start, before the first request: queue again every job accepted before and not finished (oldest first);
    one whose body this server cannot run any more (another pipeline) fails with the reason. How many queued."""
    store.expire()
    queued = 0
    for row in store.resume():
        try:
            request, _ = video_request(json.loads(row["body"]), pipe, served)
        except PlanError as exc:
            store.fail(row["id"], f"this server cannot run it after the restart: {exc}")
            continue
        queue_stored(store, jobs, row["id"], request)
        queued += 1
    return queued


def video_object(row: dict, progress: Progress, store: JobStore) -> dict:
    """A job as OpenAI's Video object."""
    status = row["status"]
    percent = {"queued": 0, "completed": 100}.get(status, 0)
    if status == "in_progress" and progress.record == row["id"] and progress.steps:
        percent = min(99, int(100 * progress.step / progress.steps))
    prompt = json.loads(row["body"]).get("prompt")
    finished = row["completed_at"]
    return {
        "id": row["id"],
        "object": "video",
        "status": status,
        "progress": percent,
        "created_at": row["created_at"],
        "completed_at": finished,
        "expires_at": None if finished is None else int(finished + store.keep_hours * 3600),
        "model": row["model"],
        "prompt": prompt,
        "seconds": row["seconds"],
        "size": row["size"],
        "error": {"code": "generation_failed", "message": row["error"]} if status == "failed" else None,
        "remixed_from_video_id": None,
    }
