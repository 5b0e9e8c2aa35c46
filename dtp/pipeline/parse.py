"""A `Request` from JSON: a line of `dtp run --prompts FILE.jsonl` or the body of `dtp serve`'s
`POST /v1/images/generations` (OpenAI's names plus dtp's). Every wrong field is a PlanError naming it.

    request_from_json(body, LINE_FIELDS, load_image=open_image_path)        # a JSONL line
    request_from_json(body, HTTP_FIELDS, load_image=decode_image_base64)    # an HTTP body
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import replace

from ..errors import PlanError
from ..policy import is_int
from .request import Request

# JSON name -> (Request field, accepted JSON type); "size" ("WxH" or one int) sets height and width.
_COMMON = {
    "prompt": ("prompt", str),
    "seed": ("seed", int),
    "size": ("size", (str, int)),
    "negative_prompt": ("negative_prompt", str),
    "guidance_scale": ("guidance_scale", (int, float)),
    "true_cfg_scale": ("true_cfg_scale", (int, float)),
    "fps": ("fps", int),
    "image": ("image", str),
}
LINE_FIELDS = _COMMON | {"steps": ("steps", int), "frames": ("frames", int), "output": ("output", str)}
HTTP_FIELDS = _COMMON | {
    "num_inference_steps": ("steps", int),
    "num_frames": ("frames", int),
    "n": ("n", int),
    "lora": ("lora", dict),
    "response_format": ("response_format", str),
    "model": ("model", str),
}


def request_from_json(body, names: dict, *, load_image, base: Request | None = None) -> tuple[Request, dict]:
    """(the Request, the fields that are not generation arguments: output, response_format, model)."""
    if not isinstance(body, dict):
        raise PlanError(f"expected a JSON object, got {type(body).__name__}.")
    unknown = sorted(set(body) - set(names))
    if unknown:
        raise PlanError(f"unknown field {', '.join(map(repr, unknown))}; known: {', '.join(sorted(names))}.")
    values, other = {}, {}
    for key, value in body.items():
        target, kind = names[key]
        _check_type(key, value, kind)
        if target == "size":
            values["width"], values["height"] = parse_size(value)
        elif target == "image":
            values["image"] = load_image(value)
        elif target == "lora":
            values["lora"] = _lora_weights(value)
        elif target in ("output", "response_format", "model"):
            other[target] = value
        else:
            values[target] = float(value) if kind == (int, float) else value
    if base is None and "prompt" not in values:
        raise PlanError("missing field 'prompt' (a string).")
    return (replace(base, **values) if base is not None else Request(**values)), other


def _check_type(key: str, value, kind) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = any(is_int(value) if k is int else isinstance(value, k) and not isinstance(value, bool) for k in kinds)
    if not ok:
        wanted = " or ".join("integer" if k is int else k.__name__ for k in kinds)
        raise PlanError(f"field {key!r} must be a {wanted}, got {type(value).__name__} {value!r}.")


def parse_size(value) -> tuple[int, int]:
    """(width, height) of "WxH" (OpenAI's form, e.g. "1024x768") or one int (square)."""
    if is_int(value):
        return value, value
    width, sep, height = value.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or int(width) < 1 or int(height) < 1:
        raise PlanError(f"size {value!r} is not WIDTHxHEIGHT in pixels, e.g. '1024x768'.")
    return int(width), int(height)


def _lora_weights(value: dict) -> dict:
    for name, weight in value.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise PlanError(f"lora {name!r}: the weight must be a number, got {weight!r}.")
    return {name: float(weight) for name, weight in value.items()}


def open_image_path(path: str):
    """The RGB image at `path` (a JSONL line's or `--image`'s)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, UnidentifiedImageError) as error:
        raise PlanError(f"image {path}: cannot read it as an image ({error}).") from None


def decode_image_base64(text: str):
    """The RGB image in base64 `text` (a data URL's "data:image/png;base64," prefix allowed)."""
    from PIL import Image, UnidentifiedImageError

    data = text.partition(",")[2] if text.startswith("data:") else text
    try:
        with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as image:
            return image.convert("RGB")
    except (binascii.Error, ValueError, OSError, UnidentifiedImageError):
        raise PlanError("image: not a base64-encoded image (PNG, JPEG, ...).") from None
