"""A generation's pixels as files and bytes: PNG for an image, MP4 for a video (diffusers' `export_to_video`
over imageio-ffmpeg: the `video` extra), float pixels as .npy.

The suffix of the output path says what to write; a video asked for as .png (or an image as .mp4) is a
`PlanError` naming both, before anything is generated when the caller checks with `check_output`.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np

from ..errors import PlanError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_SUFFIXES = (".mp4",)
DEFAULT_OUTPUTS = {False: "output.png", True: "output.mp4"}  # by "is a video"


def default_output(video: bool) -> str:
    return DEFAULT_OUTPUTS[video]


def check_output(path, video: bool) -> None:
    """PlanError when `path`'s suffix cannot hold what the pipeline makes."""
    suffix = Path(path).suffix.lower()
    wanted = VIDEO_SUFFIXES if video else IMAGE_SUFFIXES
    if suffix not in wanted:
        kind = "a video" if video else "an image"
        raise PlanError(f"output {path}: this pipeline makes {kind}; name the file with {' or '.join(wanted)}.")


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    return (pixels * 255).round().clip(0, 255).astype(np.uint8)


def save_image(pixels: np.ndarray, path) -> None:
    from PIL import Image

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(to_uint8(pixels)).save(path)


def save_video(frames: np.ndarray, path, fps: int) -> None:
    """F x H x W x 3 floats in [0, 1] as an H.264 mp4 (sizes that are not multiples of 16 are kept, not padded)."""
    from diffusers.utils import export_to_video

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    export_to_video(list(frames), str(path), fps=fps, macro_block_size=1)


def save(pixels: np.ndarray, path, *, video: bool, fps: int) -> None:
    """The output at `path`, by what it is (`check_output` first)."""
    check_output(path, video)
    if video:
        save_video(pixels, path, fps)
    else:
        save_image(pixels, path)


def encode(pixels: np.ndarray, *, video: bool, fps: int) -> bytes:
    """The file bytes `save` would write to an .mp4 (video) or .png (image)."""
    if not video:
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(to_uint8(pixels)).save(buffer, format="PNG")
        return buffer.getvalue()
    with tempfile.TemporaryDirectory(prefix="dtp-video-") as folder:
        path = Path(folder) / "video.mp4"  # imageio-ffmpeg writes through a file
        save_video(pixels, path, fps)
        return path.read_bytes()


def read_video(path) -> np.ndarray:
    """The frames of an mp4 as F x H x W x 3 uint8 (imageio-ffmpeg)."""
    import imageio.v3 as iio

    return np.asarray(iio.imread(path, plugin="FFMPEG"))
