"""`/v1/images/edits` as OpenAI's own client sends it (a multipart upload): `torchrun --nproc-per-node 2 -m dtp serve`
on the tiny FLUX.1 Kontext pipeline (real sockets, nothing mocked). The edited image equals the one-process
`dtp run --image` of the same image, prompt and seed (PNG within 1/255), and differs from the edit of another image
(the negative control: a server that dropped the upload would answer the same picture for both; the tiny
Kontext moves little with its input: measured mean |diff| 2.5e-4).

Kontext scales its input to about 1024 x 1024 unless told not to: the server and `dtp run` both get
`--pipeline-arg max_area=1024 --pipeline-arg _auto_resize=false` (the tiny pipeline's call).
"""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image

from dtp.testing.conditioned_pipelines import sample_image, tiny_flux_kontext_pipeline
from dtp.testing.serving import serving
from dtp.tools.cli import main

SMALL = ["--pipeline-arg", "max_area=1024", "--pipeline-arg", "_auto_resize=false"]
SEED, STEPS, ONE_LEVEL = 3, 2, 1 / 255


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64) / 255


# a server launch plus two runs: `full` to keep the suite's time (passed at the merge).
@pytest.mark.full
def test_openai_images_edit_equals_dtp_run_image(tmp_path):
    model_dir = tmp_path / "kontext"
    tiny_flux_kontext_pipeline().save_pretrained(model_dir)
    source, other = sample_image(32, seed=1), sample_image(32, seed=2)
    source.save(tmp_path / "in.png")
    with serving(model_dir, tmp_path / "server.log", *SMALL) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        extra = {"seed": SEED, "num_inference_steps": STEPS}
        edits = [
            client.images.edit(
                image=("in.png", _png(image), "image/png"), prompt="a cat", size="32x32", extra_body=extra
            )
            for image in (source, other)
        ]
        with_mask = {"mask": ("mask.png", _png(source), "image/png")}
        try:
            client.images.edit(image=("in.png", _png(source), "image/png"), prompt="a cat", **with_mask)
            refused = None
        except openai.BadRequestError as exc:
            refused = exc.body["message"]
    served, served_other = (_pixels(base64.b64decode(e.data[0].b64_json)) for e in edits)
    argv = ["run", "--model-dir", str(model_dir), "--prompt", "a cat", "--seed", str(SEED), "--steps", str(STEPS)]
    argv += ["--height", "32", "--width", "32", "--image", str(tmp_path / "in.png"), "--dtype", "fp32", *SMALL]
    assert main([*argv, "--output", str(tmp_path / "run.png")]) == 0
    reference = np.asarray(Image.open(tmp_path / "run.png"), dtype=np.float64) / 255
    assert served.shape == reference.shape == (32, 32, 3)
    assert np.abs(served - reference).max() <= ONE_LEVEL + 1e-9
    assert np.abs(served_other - reference).mean() > 1e-5  # the upload reached the pipeline (measured 2.5e-4)
    assert refused is not None and "mask" in refused, refused
