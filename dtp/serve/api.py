"""OpenAI's image and video API bodies as dtp `Request`s: every field OpenAI's client sends is known here.

    body = read_body(raw, content_type)                     # JSON, or multipart/form-data as the client uploads
    request, output, stream = image_request(body, pipe, ...)    # /v1/images/generations and /v1/images/edits
    request = video_request(body, pipe, ...)                # /v1/videos

Of OpenAI's image fields dtp ignores what does not apply (`user`, `safety_identifier`, `moderation`, `complexity`,
`input_fidelity`, `partial_images` 0, `background` "auto" / "opaque": every image is opaque), accepts `quality`
without changing the generation (the step count is `num_inference_steps`), honours `output_format` png / jpeg /
webp with `output_compression` and `stream` (server-sent events of the step progress, `sse`), and refuses with a
PlanError (a 400) naming the value what it cannot honour: `style`, `background` "transparent", `response_format`
"url", gif / svg output and their fields, `mask`, `markup`, `partial_images` above 0 with `stream`. A multipart
form carries strings: numbers and `lora[NAME]` weights are read from them.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field, replace
from email.parser import BytesParser
from email.policy import HTTP

from ..errors import PlanError
from ..pipeline.parse import HTTP_FIELDS, decode_image_base64, request_from_json
from ..pipeline.request import DEFAULT_FPS, call_parameters, check_request, frame_step, makes_video
from .jobs import Output

IGNORED = {  # OpenAI's fields that change nothing here, with the values OpenAI takes
    "user": None,
    "safety_identifier": None,
    "moderation": ("low", "auto"),
    "complexity": ("low", "medium", "high"),
    "input_fidelity": ("high", "low"),
    "quality": ("low", "medium", "high", "xhigh", "max", "auto", "standard", "hd"),
}
REFUSED = {  # field -> why dtp cannot honour it (any value but null)
    "style": "dtp does not restyle a prompt (OpenAI's DALL-E 3 option); leave it out",
    "svg": "dtp writes no SVG",
    "frame_count": "GIF output only; dtp writes no GIF (a video pipeline takes num_frames)",
    "frame_duration_ms": "GIF output only; dtp writes no GIF (a video pipeline takes fps)",
    "mask": "dtp does not inpaint with a mask; send the image alone",
    "markup": "dtp takes no markup overlay; send the image alone",
}
IMAGE_FORMATS = ("png", "jpeg", "webp")
INT_FORM_FIELDS = ("output_compression", "partial_images")


def read_body(raw: bytes, content_type: str) -> dict:
    """The fields of a JSON body, or of a multipart form (files as bytes, repeated names and `name[]` as lists)."""
    if content_type.split(";")[0].strip().lower() == "multipart/form-data":
        return _form(raw, content_type)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"the body is not JSON ({exc}).") from None
    if not isinstance(body, dict):
        raise PlanError(f"expected a JSON object, got {type(body).__name__}.")
    return body


def _form(raw: bytes, content_type: str) -> dict:
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
    if not message.is_multipart():
        raise PlanError("the multipart body has no parts (is the boundary right?).")
    fields: dict = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            raise PlanError("a part of the multipart body has no name.")
        data = part.get_payload(decode=True) or b""
        value = data if part.get_filename() is not None else data.decode("utf-8", "replace")
        if name.endswith("[]"):
            fields.setdefault(name[:-2], []).append(value)
        elif "[" in name and name.endswith("]"):  # lora[style]=0.5
            outer, _, inner = name[:-1].partition("[")
            fields.setdefault(outer, {})[inner] = _number(f"{outer}[{inner}]", value, float)
        else:
            fields[name] = value
    return {name: _typed(name, value) for name, value in fields.items()}


def _typed(name: str, value):
    """A form string as the JSON type its field takes (numbers, booleans); files and other text as given."""
    if not isinstance(value, str):
        return value
    kind = HTTP_FIELDS.get(name, (None, None))[1]
    if kind is int or name in INT_FORM_FIELDS:
        return _number(name, value, int)
    if kind == (int, float):
        return _number(name, value, float)
    if name == "stream":
        return value.lower() == "true"
    return value


def _number(name: str, text, kind):
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise PlanError(f"field {name!r} must be a number, got {text!r}.") from None


def _openai_fields(body: dict) -> tuple[dict, dict]:
    """(the body without OpenAI's fields that are not generation arguments, those fields); PlanError for a value
    dtp cannot honour."""
    body, taken = dict(body), {}
    for name, allowed in IGNORED.items():
        value = body.pop(name, None)
        if value is not None and allowed is not None and value not in allowed:
            raise PlanError(f"{name} {value!r}: OpenAI takes {', '.join(allowed)}.")
    for name, why in REFUSED.items():
        value = body.pop(name, None)
        if value is not None:
            raise PlanError(f"{name} {_shown(value)}: {why}.")
    background = body.pop("background", None)
    if background not in (None, "auto", "opaque"):
        raise PlanError(f"background {background!r}: dtp makes opaque images only; use 'opaque' or 'auto'.")
    stream = body.pop("stream", None)
    if stream not in (None, True, False):
        raise PlanError(f"stream {stream!r}: true or false.")
    taken["stream"] = bool(stream)
    partial = body.pop("partial_images", None)
    if partial is not None and (isinstance(partial, bool) or not isinstance(partial, int) or not 0 <= partial <= 3):
        raise PlanError(f"partial_images {partial!r}: an integer from 0 to 3 (dtp sends none).")
    if stream and partial:
        raise PlanError(
            f"partial_images {partial}: dtp streams the step progress, not partial images (each would cost a VAE "
            "decode on every rank in the middle of the generation); use 0 or leave it out."
        )
    response_format = body.pop("response_format", None)
    if response_format not in (None, "b64_json"):
        raise PlanError(f"response_format {response_format!r}: this server answers b64_json only (it keeps no files).")
    if body.get("size") == "auto":
        del body["size"]  # the pipeline's default size
    for name in ("output_format", "output_compression", "model"):
        if name in body:
            taken[name] = body.pop(name)
    return body, taken


def _shown(value) -> str:
    return f"{len(value)} bytes" if isinstance(value, bytes) else repr(value)


def _output(taken: dict, video: bool) -> Output:
    fmt = taken.get("output_format")
    compression = taken.get("output_compression")
    if video:
        if fmt not in (None, "mp4"):
            raise PlanError(f"output_format {fmt!r}: this pipeline makes videos, answered as mp4.")
        return Output("mp4")
    if fmt is not None and fmt not in IMAGE_FORMATS:
        raise PlanError(f"output_format {fmt!r}: dtp writes {', '.join(IMAGE_FORMATS)}.")
    if compression is not None and (isinstance(compression, bool) or not isinstance(compression, int)):
        raise PlanError(f"output_compression {compression!r}: an integer from 0 to 100.")
    if compression is not None and not 0 <= compression <= 100:
        raise PlanError(f"output_compression {compression}: an integer from 0 to 100.")
    return Output(fmt or "png", compression if fmt in ("jpeg", "webp") else None)


@dataclass(frozen=True)
class Served:
    """What the server runs: the model's name (a request's `model` must match), the LoRA names loaded, and the
    `--pipeline-arg` keywords every request gets (a request's own extra keywords win)."""

    model_id: str
    loras: set = field(default_factory=set)
    defaults: dict = field(default_factory=dict)


def _check_model(taken: dict, served: Served) -> None:
    model = taken.get("model")
    if model is not None and model != served.model_id:
        raise PlanError(f"model {model!r}: this server runs {served.model_id!r}.")


def _finish(request, pipe, served: Served):
    """The request with the server's default keywords, checked against the LoRAs loaded and the pipeline."""
    unknown = sorted(set(request.lora or {}) - served.loras)
    if unknown:
        known = ", ".join(sorted(served.loras)) or "none (start the server with --lora NAME=PATH)"
        raise PlanError(f"lora {', '.join(map(repr, unknown))} is not loaded; loaded: {known}.")
    request = replace(request, extra={**served.defaults, **request.extra})
    check_request(pipe, request)
    return request


def _as_base64_image(value, name: str) -> str:
    """An uploaded file (bytes) or a one-file list as the base64 text `request_from_json` decodes."""
    if isinstance(value, list):
        if len(value) != 1:
            raise PlanError(f"{name}: {len(value)} images; dtp's pipelines take one.")
        value = value[0]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, str):
        return value
    raise PlanError(f"{name}: expected an image file or base64 text, got {type(value).__name__}.")


def image_request(body: dict, pipe, served: Served, *, edit: bool = False):
    """(the checked Request, its Output, whether it streams) of an images body; PlanError (a 400) for anything
    wrong with it."""
    body, taken = _openai_fields(body)
    _check_model(taken, served)
    if edit:
        if "image" not in body:
            raise PlanError("image: /v1/images/edits needs the image to edit (a file part named 'image').")
        if "image" not in call_parameters(pipe):
            raise PlanError(
                f"image: {type(pipe).__name__} takes no input image (a text-to-image pipeline); serve an "
                "image-conditioned one (FLUX.1 Kontext, FLUX.2, Qwen-Image-Edit) or POST /v1/images/generations."
            )
    if "image" in body:
        body["image"] = _as_base64_image(body["image"], "image")
    request, _ = request_from_json(body, HTTP_FIELDS, load_image=decode_image_base64)
    request = _finish(request, pipe, served)
    video = makes_video(pipe)
    if taken["stream"] and video:
        raise PlanError("stream true: a video is not streamed; POST /v1/videos and poll its progress instead.")
    return request, _output(taken, video), taken["stream"]


def video_request(body: dict, pipe, served: Served):
    """(the checked Request, the seconds it lasts as text) of a /v1/videos body: OpenAI's prompt, model, seconds,
    size, input_reference, plus dtp's fields (seed, num_frames, fps, num_inference_steps, ...)."""
    if not makes_video(pipe):
        raise PlanError(f"{type(pipe).__name__} makes images; POST /v1/images/generations (this is /v1/videos).")
    body = dict(body)
    seconds = body.pop("seconds", None)
    reference = body.pop("input_reference", None)
    if reference is not None:
        if "image" in body:
            raise PlanError("input_reference and image: give the conditioning image once.")
        body["image"] = _as_base64_image(reference, "input_reference")
    body, taken = _openai_fields(body)
    _check_model(taken, served)
    if taken["stream"]:
        raise PlanError("stream true: a video job is not streamed; poll GET /v1/videos/{id} for its progress.")
    if taken.get("output_format") not in (None, "mp4"):
        raise PlanError(f"output_format {taken['output_format']!r}: a video job answers an mp4.")
    if seconds is not None:
        if "num_frames" in body:
            raise PlanError(f"seconds {seconds!r} and num_frames {body['num_frames']!r}: give one of them.")
        body["num_frames"] = frames_of(seconds, body.get("fps", DEFAULT_FPS), frame_step(pipe))
    if "image" in body:
        body["image"] = _as_base64_image(body["image"], "image")
    request, _ = request_from_json(body, HTTP_FIELDS, load_image=decode_image_base64)
    if request.n != 1:
        raise PlanError(f"n {request.n}: a video job makes one video; create one job per video.")
    request = _finish(request, pipe, served)
    shown = str(seconds) if seconds is not None else (f"{request.frames / request.fps:g}" if request.frames else "")
    return request, shown


def frames_of(seconds, fps, step: int) -> int:
    """`seconds` at `fps` as the nearest frame count the pipeline takes (`k * step + 1`, at least `step + 1`)."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        raise PlanError(f"seconds {seconds!r}: a number of seconds, e.g. '4'.") from None
    if isinstance(seconds, bool) or not math.isfinite(value) or value <= 0:
        raise PlanError(f"seconds {seconds!r}: a positive number of seconds.")
    if isinstance(fps, bool) or not isinstance(fps, int) or fps < 1:
        raise PlanError(f"fps {fps!r}: a positive integer.")
    k = max(1, round((value * fps - 1) / step))
    return k * step + 1
