"""`dtp serve` as a user runs it: `torchrun --nproc-per-node 2` on the tiny FLUX.1 checkpoint with a LoRA loaded
under a name, real sockets, a real HTTP client (httpx), nothing mocked.

One server for the module (started through `serve_fault.py`, which plants a failure in rank 1's VAE decode for
48 x 48 requests only); references from the one-process `dtp run --prompts` in this process (the model loaded
once). PNGs are compared as decoded pixels: within 1/255 (measured: 0 or 1/255 where fp32 rounding flips a level).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from lora_cases import random_lora
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import save_file

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.serving import alive, quiet_env, rank_processes, serving
from dtp.testing.tiny import tiny_model
from dtp.tools.cli import main

FAULT = Path(__file__).resolve().parent / "serve_fault.py"
SIZE, FAIL_SIZE, STEPS = 32, 48, 2
SIZES = (SIZE, 16)  # mixed sizes: two batch keys
REQUESTS = [{"prompt": f"a cat number {i % 3}", "seed": i, "size": f"{SIZES[i % 2]}x{SIZES[i % 2]}",
             "num_inference_steps": STEPS} for i in range(8)]  # fmt: skip
BATCH = ("--max-batch", "4", "--batch-wait-ms", "300")
ONE_LEVEL = 1 / 255


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    lora = root / "style.safetensors"
    save_file(random_lora(tiny_model("FluxTransformer2DModel"), seed=10), str(lora))
    return tiny_checkpoint("flux"), lora, root  # the shared cache: built once per machine, only read


@pytest.fixture(scope="module")
def server(checkpoint):
    """The module's server: 2 ranks through `serve_fault.py` (rank 1 fails 48 x 48 requests), the LoRA as "style"."""
    model_dir, lora, root = checkpoint
    env = quiet_env(DTP_TEST_FAIL_RANK="1", DTP_TEST_FAIL_SIZE=str(FAIL_SIZE))
    with serving(model_dir, root / "server.log", "--lora", f"style={lora}", *BATCH, script=FAULT, env=env) as server:
        yield server


def _pixels(png_b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(png_b64))).convert("RGB"), dtype=np.float64) / 255


def _references(checkpoint, lines: list[dict], *flags) -> list[np.ndarray]:
    """The one-process `dtp run --prompts` of `lines` (JSONL names), in this process; the PNGs it writes."""
    model_dir, _, root = checkpoint
    folder = Path(root) / f"ref{len(list(Path(root).glob('ref*')))}"
    folder.mkdir()
    (folder / "batch.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    argv = ["run", "--model-dir", str(model_dir), "--prompts", str(folder / "batch.jsonl"), "--dtype", "fp32"]
    assert main([*argv, "--output", str(folder / "ref.png"), *flags]) == 0
    return [np.asarray(Image.open(folder / f"ref-{n}.png"), dtype=np.float64) / 255 for n in range(1, len(lines) + 1)]


def _as_line(body: dict) -> dict:
    return {"prompt": body["prompt"], "seed": body["seed"], "size": body["size"], "steps": body["num_inference_steps"]}


def test_health_and_models(server):
    client = server.client
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["loaded"] is True
    models = client.get("/v1/models").json()["data"]
    assert [(m["kind"], m["loras"]) for m in models] == [("image", ["style"])]


def test_eight_clients_batched_equal_dtp_run(server, checkpoint):
    """8 concurrent clients, two sizes: all 200; each PNG equals the one-process `dtp run` of its prompt and seed
    (the LoRA at its loaded weight), though the server (--max-batch 4) ran them in batches of one size, as its log
    shows. (16 clients until round 14: 8, four of each size, still fill a whole batch of each size, at half the
    generations here and on the ranks; benchmarks/serve_load.py runs 16 clients at load.)"""
    client = server.client
    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        answers = list(pool.map(lambda body: client.post("/v1/images/generations", json=body), REQUESTS))
    assert [a.status_code for a in answers] == [200] * len(REQUESTS), [a.text[:200] for a in answers]
    _, lora, _ = checkpoint
    references = _references(checkpoint, [_as_line(b) for b in REQUESTS], "--lora", f"style={lora}")
    for answer, reference in zip(answers, references, strict=True):
        data = answer.json()
        assert data["output_format"] == "png" and len(data["data"]) == 1
        assert np.abs(_pixels(data["data"][0]["b64_json"]) - reference).max() <= ONE_LEVEL + 1e-9
    batches = [int(n) for n in re.findall(r"batch of (\d+)", server.log.read_text())]
    assert batches and max(batches) > 1, server.log.read_text()[-2000:]


def test_a_request_chooses_its_lora_weight(server, checkpoint):
    """{"lora": {"style": 0.3}} equals `dtp run --lora style=... --lora-scale 0.3`, and differs from the default."""
    client = server.client
    body = {**REQUESTS[0], "lora": {"style": 0.3}}
    answer = client.post("/v1/images/generations", json=body)
    assert answer.status_code == 200, answer.text
    _, lora, _ = checkpoint
    (reference,) = _references(checkpoint, [_as_line(body)], "--lora", f"style={lora}", "--lora-scale", "0.3")
    pixels = _pixels(answer.json()["data"][0]["b64_json"])
    assert np.abs(pixels - reference).max() <= ONE_LEVEL + 1e-9
    default = _pixels(client.post("/v1/images/generations", json=REQUESTS[0]).json()["data"][0]["b64_json"])
    assert np.abs(pixels - default).mean() > 10 * ONE_LEVEL  # the weight really changed the image


BAD = {
    "not JSON": b"{prompt: a cat",
    "not an object": b'["a cat"]',
    "no prompt": b'{"seed": 1}',
    "prompt not a string": b'{"prompt": 7}',
    "unknown field": b'{"prompt": "a cat", "colour": "red"}',
    "size not WxH": b'{"prompt": "a cat", "size": "big"}',
    "size the pipeline cannot take": b'{"prompt": "a cat", "size": "33x32"}',
    "unknown LoRA": b'{"prompt": "a cat", "lora": {"nope": 1}}',
    "frames for an image pipeline": b'{"prompt": "a cat", "num_frames": 5}',
    "image not base64": b'{"prompt": "a cat", "image": "%%%"}',
    "url response format": b'{"prompt": "a cat", "response_format": "url"}',
    "negative steps": b'{"prompt": "a cat", "num_inference_steps": -1}',
}


def test_bad_requests_get_4xx_with_a_json_error_and_the_server_goes_on(server):
    client = server.client
    for name, body in BAD.items():
        answer = client.post("/v1/images/generations", content=body, headers={"content-type": "application/json"})
        assert 400 <= answer.status_code < 500, (name, answer.status_code, answer.text)
        assert isinstance(answer.json()["error"]["message"], str), name
    assert client.post("/v1/images/generations", json=REQUESTS[1]).status_code == 200


# OpenAI's images.generate parameters (openai 3.57): each one the client sends, with a value dtp takes (200, the
# same image: none of them changes the generation) or one it cannot honour (400 naming the value).
ACCEPTED = {
    "background": ["auto", "opaque"],
    "moderation": ["low", "auto"],
    "quality": ["low", "medium", "high", "xhigh", "max", "auto", "standard", "hd"],
    "complexity": ["low", "high"],
    "partial_images": [0],
    "user": ["someone"],
    "safety_identifier": ["abc"],
    "response_format": ["b64_json"],
    "n": [1],
    "output_format": ["png"],
}
REFUSED = {
    "style": ("vivid", "'vivid'"),
    "background": ("transparent", "'transparent'"),
    "response_format": ("url", "'url'"),
    "output_format": ("gif", "'gif'"),
    "svg": ({"model": "x"}, "svg"),
    "frame_count": (4, "frame_count 4"),
    "frame_duration_ms": (100, "frame_duration_ms 100"),
    "quality": ("ultra", "'ultra'"),
    "model": ("dall-e-3", "'dall-e-3'"),
}


def _openai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


PLAIN = {"prompt": REQUESTS[0]["prompt"], "size": REQUESTS[0]["size"]}
EXTRA = {"seed": REQUESTS[0]["seed"], "num_inference_steps": STEPS}


def test_openai_client_every_image_parameter(server):
    """The official `openai` client unchanged: every accepted parameter at once gives the plain image, each refused
    one a 400 naming the value; jpeg / webp answered as such; images.edit on a text-to-image pipeline a 400."""
    client = _openai(server)
    reference = _pixels(client.images.generate(**PLAIN, extra_body=EXTRA).data[0].b64_json)
    every = {name: values[-1] for name, values in ACCEPTED.items()}
    answer = client.images.generate(**PLAIN, **every, extra_body=EXTRA)
    assert np.abs(_pixels(answer.data[0].b64_json) - reference).max() == 0
    for name, (value, named) in REFUSED.items():
        with pytest.raises(openai.BadRequestError) as refused:
            client.images.generate(**PLAIN, **{name: value}, extra_body=EXTRA)
        assert named in refused.value.body["message"], (name, refused.value.body)
    for fmt, magic in (("jpeg", b"\xff\xd8\xff"), ("webp", b"RIFF")):
        answer = client.images.generate(**PLAIN, output_format=fmt, output_compression=10, extra_body=EXTRA)
        data = base64.b64decode(answer.data[0].b64_json)
        assert answer.output_format == fmt and data.startswith(magic), (fmt, data[:8])
        decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64) / 255
        assert np.abs(decoded - reference).mean() < 0.1  # lossy, but the same picture
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.edit(image=("cat.png", io.BytesIO(base64.b64decode(_png(reference))), "image/png"), prompt="x")
    assert "FluxPipeline takes no input image" in refused.value.body["message"]


@pytest.mark.full
def test_openai_client_each_accepted_value(server):
    """Each accepted value alone (the default run sends them all in one request)."""
    client = _openai(server)
    reference = _pixels(client.images.generate(**PLAIN, extra_body=EXTRA).data[0].b64_json)
    for name, values in ACCEPTED.items():
        for value in values:
            answer = client.images.generate(**PLAIN, **{name: value}, extra_body=EXTRA)
            assert np.abs(_pixels(answer.data[0].b64_json) - reference).max() == 0, (name, value)


def test_openai_client_streams_each_step_then_the_image(server):
    """images.generate(stream=True) with the official client: one progress event per denoising step, exactly (1 ...
    steps: 2 steps give 2 events, 3 give 3), then the completed event with the non-streamed image; the answer is
    text/event-stream; partial_images > 0 a 400 naming it; a generation that fails on rank 1 an error event (the
    client raises)."""
    client = _openai(server)
    reference = client.images.generate(**PLAIN, extra_body=EXTRA).data[0].b64_json
    for steps in (STEPS + 1, STEPS):
        events = list(client.images.generate(**PLAIN, stream=True, extra_body={**EXTRA, "num_inference_steps": steps}))
        kinds = [event.type for event in events]
        assert kinds == ["image_generation.progress"] * steps + ["image_generation.completed"], kinds
        assert [(event.step, event.steps) for event in events[:-1]] == [(k, steps) for k in range(1, steps + 1)]
    completed = events[-1]  # of STEPS steps, as the reference
    assert (completed.output_format, completed.size) == ("png", PLAIN["size"])
    assert np.abs(_pixels(completed.b64_json) - _pixels(reference)).max() == 0
    with ThreadPoolExecutor(2) as pool:  # a streamed request in a batch with a plain one (the log says batch of 2)
        batches = server.log.read_text().count("batch of 2")
        plain = pool.submit(client.images.generate, **PLAIN, extra_body={**EXTRA, "seed": 7})
        events = list(client.images.generate(**PLAIN, stream=True, extra_body=EXTRA))
    assert [event.type for event in events].count("image_generation.progress") == STEPS
    assert np.abs(_pixels(events[-1].b64_json) - _pixels(reference)).max() <= ONE_LEVEL + 1e-9
    assert plain.result().data[0].b64_json and server.log.read_text().count("batch of 2") == batches + 1
    with server.client.stream("POST", "/v1/images/generations", json={**PLAIN, **EXTRA, "stream": True}) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines() if line.startswith("event: ")]
    assert lines == ["event: image_generation.progress"] * STEPS + ["event: image_generation.completed"], lines
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.generate(**PLAIN, stream=True, partial_images=2, extra_body=EXTRA)
    assert "partial_images 2" in refused.value.body["message"]
    with pytest.raises(openai.APIError, match="rank 1: RuntimeError: planted failure"):
        list(client.images.generate(**{**PLAIN, "size": f"{FAIL_SIZE}x{FAIL_SIZE}"}, stream=True, extra_body=EXTRA))


def _png(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray((pixels * 255).round().astype(np.uint8)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_a_client_that_leaves_does_not_stall_the_ranks(server):
    client = server.client
    with pytest.raises(httpx.TimeoutException):
        client.post("/v1/images/generations", json=REQUESTS[2], timeout=0.05)
    assert client.post("/v1/images/generations", json=REQUESTS[3]).status_code == 200


def test_a_failure_on_one_rank_fails_only_its_batch_and_the_next_request_runs(server):
    """Two 48 x 48 requests (rank 1 fails them) sent with two good ones: the 48s get a 500 naming rank 1's error
    (they may share a batch), the others a 200; then a request runs normally."""
    client, log = server.client, server.log
    failing = [{**REQUESTS[i], "size": f"{FAIL_SIZE}x{FAIL_SIZE}"} for i in (0, 2)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda b: client.post("/v1/images/generations", json=b), [*failing, *REQUESTS[4:6]]))
    assert [a.status_code for a in answers] == [500, 500, 200, 200], [a.text[:200] for a in answers]
    for answer in answers[:2]:
        assert "rank 1: RuntimeError: planted failure" in answer.json()["error"]["message"]
        assert "rank 0" not in answer.json()["error"]["message"]  # rank 0 generated; only rank 1 failed
    assert client.post("/v1/images/generations", json=REQUESTS[4]).status_code == 200
    assert "failed" in log.read_text() and client.get("/health").json()["failed"] >= 2


def _scrape(server) -> dict:
    """{(metric sample name, labels without replica): value} of GET /metrics, parsed by prometheus_client."""
    answer = server.client.get("/metrics")
    assert answer.status_code == 200, answer.text
    samples = (s for family in text_string_to_metric_families(answer.text) for s in family.samples)
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "replica"))): s.value for s in samples}


def test_metrics_count_what_the_test_sent(server):
    """/metrics parses with prometheus_client's parser; its request counts grow by exactly what this test sent."""
    before = _scrape(server)
    sent = {"200": 2, "400": 3}
    for _ in range(sent["200"]):
        assert server.client.post("/v1/images/generations", json=REQUESTS[1]).status_code == 200
    for _ in range(sent["400"]):
        assert server.client.post("/v1/images/generations", json={"prompt": "a", "size": "big"}).status_code == 400
    after = _scrape(server)
    for status, count in sent.items():
        key = ("dtp_serve_requests_total", (("endpoint", "/v1/images/generations"), ("status", status)))
        assert after.get(key, 0) - before.get(key, 0) == count, (status, before.get(key), after.get(key))
    steps = ("dtp_serve_steps_total", ())
    assert after[steps] - before.get(steps, 0) == sent["200"] * STEPS
    batches = ("dtp_serve_batch_size_count", ())
    assert after[batches] - before.get(batches, 0) == sent["200"]  # one after the other: batches of one


def test_sigterm_ends_every_rank(server):
    """Last in the module: SIGTERM to torchrun ends the launcher and both ranks (each in a session of its own)."""
    process, log = server.process, server.log
    ranks = rank_processes(server)
    assert len(ranks) == 2, ranks
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=20)
    assert log.read_text().count("stopped") == 2, log.read_text()[-2000:]
    deadline = time.monotonic() + 10  # a rank's own exit may trail the launcher's by a moment
    while alive(ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(ranks) == [], alive(ranks)
