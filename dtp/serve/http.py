"""The HTTP face of `dtp serve`, on rank 0: FastAPI routes over the job queue (the `serve` extra).

    GET  /health                   200 {"status": "ok", ...progress} once every rank has loaded, 503 while loading
    GET  /v1/models                the loaded pipeline (OpenAI's list form), its kind and LoRA names
    POST /v1/images/generations    OpenAI's body (prompt, n, size "WxH", response_format "b64_json") plus seed,
                                   num_inference_steps, negative_prompt, guidance_scale, true_cfg_scale,
                                   image (base64), num_frames, fps, lora {name: weight}
                                   -> {"created", "data": [{"b64_json"}], "output_format": "png" | "mp4"}

A request is checked here, before any rank sees it: bad JSON, unknown or wrong-typed fields, sizes or frames
the pipeline cannot take, unknown LoRA names -> 400 with {"error": {"message": ...}}; a full queue -> 503;
a generation that failed on any rank -> 500 with the ranks' messages. Imported only by `dtp serve`, once it has
checked that FastAPI is installed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import asdict

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..errors import PlanError
from ..pipeline.parse import HTTP_FIELDS, decode_image_base64, request_from_json
from ..pipeline.request import check_request, makes_video
from .jobs import JobFailed, JobQueue, Progress

RESPONSE_FORMATS = ("b64_json",)  # no "url": the server keeps no files


def error(status: int, message: str):
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def parse_body(raw: bytes, pipe, model_id: str, loras: set[str]):
    """The checked `Request` of a request body; PlanError (a 400) for anything wrong with it."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"the body is not JSON ({exc}).") from None
    request, other = request_from_json(body, HTTP_FIELDS, load_image=decode_image_base64)
    if other.get("response_format", "b64_json") not in RESPONSE_FORMATS:
        raise PlanError(f"response_format {other['response_format']!r}: this server answers b64_json only.")
    if other.get("model", model_id) != model_id:
        raise PlanError(f"model {other['model']!r}: this server runs {model_id!r}.")
    unknown = sorted(set(request.lora or {}) - loras)
    if unknown:
        known = ", ".join(sorted(loras)) or "none (start the server with --lora NAME=PATH)"
        raise PlanError(f"lora {', '.join(map(repr, unknown))} is not loaded; loaded: {known}.")
    check_request(pipe, request)
    return request


def build_app(loaded: dict, jobs: JobQueue, progress: Progress, *, model_id: str, loras: set[str]) -> FastAPI:
    """The routes; `loaded["pipe"]` is rank 0's pipeline once every rank has loaded (until then: 503s)."""
    app = FastAPI(title="dtp serve")

    @app.get("/health")
    def health():
        state = {"status": "ok" if progress.loaded else "loading", **asdict(progress)}
        return JSONResponse(state, status_code=200 if progress.loaded else 503)

    @app.get("/v1/models")
    def models():
        if not progress.loaded:
            return error(503, "the model is still loading; GET /health says when it is ready.")
        kind = "video" if makes_video(loaded["pipe"]) else "image"
        entry = {"id": model_id, "object": "model", "owned_by": "dtp", "kind": kind}
        return {"object": "list", "data": [{**entry, "loras": sorted(loras)}]}

    @app.post("/v1/images/generations")
    async def generations(http: Request):
        if not progress.loaded:
            return error(503, "the model is still loading; GET /health says when it is ready.")
        try:
            request = parse_body(await http.body(), loaded["pipe"], model_id, loras)
        except PlanError as exc:
            return error(400, str(exc))
        job = jobs.put(request)
        if job is None:
            return error(503, "the queue is full; retry later.")
        try:
            result = await asyncio.wrap_future(job.future)
        except JobFailed as exc:
            return error(500, f"the generation failed: {exc}")
        data = [{"b64_json": base64.b64encode(o).decode()} for o in result.outputs]
        return {"created": int(time.time()), "data": data, "output_format": "mp4" if result.video else "png"}

    return app
