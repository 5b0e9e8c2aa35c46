"""`dtp serve --replicas 2` as a user runs it: torchrun with 4 gloo ranks on the tiny FLUX.1 checkpoint, two replicas
of tp = 2 each, real sockets and a real HTTP client, nothing mocked (one server launch for the module).

Rank 0 (replica 0's leader and the HTTP server) hands each batch to an idle replica; replica 1's leader (rank 2) gets
it over torchrun's store. Each image equals the one-process `dtp run` of its prompt and seed (within 1/255, as in
test_serve.py); /health, /metrics and the log show that both replicas served.
"""

from __future__ import annotations

import base64
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from dtp.errors import PlanError
from dtp.families.pipelines import tiny_checkpoint
from dtp.serve.replicas import layout
from dtp.testing.serving import serving
from dtp.tools.cli import main

STEPS = 2
REQUESTS = [{"prompt": f"a dog number {i % 3}", "seed": 100 + i, "size": "32x32", "num_inference_steps": STEPS}
            for i in range(8)]  # fmt: skip
ONE_LEVEL = 1 / 255


def test_layout_splits_the_world_or_says_why():
    assert layout(4, 2, cp=1, cfg=1) == (2, 2)
    assert layout(8, 2, cp=2, cfg=1) == (4, 2)
    assert layout(8, 4, cp=1, cfg=2) == (2, 1)
    with pytest.raises(PlanError, match="--replicas 3: must divide the number of processes"):
        layout(4, 3, cp=1, cfg=1)
    with pytest.raises(PlanError, match="each replica has 4 / 2 = 2 ranks, which cp \\* cfg = 4 must divide"):
        layout(4, 2, cp=2, cfg=2)
    with pytest.raises(PlanError, match="--replicas 0"):
        layout(4, 0, cp=1, cfg=1)
    with pytest.raises(PlanError, match="--cp 3 times --cfg 1 must divide the number of processes"):
        layout(4, 1, cp=3, cfg=1)  # without --replicas: the message it always had


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicas")
    return tiny_checkpoint("flux"), root  # the shared cache: built once per machine, only read


def test_replicas_without_torchrun_is_a_plan_error_before_loading(checkpoint, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    model_dir, _ = checkpoint
    assert main(["serve", "--model-dir", str(model_dir), "--replicas", "2", "--port", "1"]) != 0
    assert "--replicas 2: replicas split torchrun's ranks" in capsys.readouterr().err


def _pixels(png_b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(png_b64))).convert("RGB"), dtype=np.float64) / 255


def _references(model_dir, root: Path, bodies: list[dict]) -> list[np.ndarray]:
    lines = [{"prompt": b["prompt"], "seed": b["seed"], "size": b["size"], "steps": STEPS} for b in bodies]
    (root / "batch.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    argv = ["run", "--model-dir", str(model_dir), "--prompts", str(root / "batch.jsonl"), "--dtype", "fp32"]
    assert main([*argv, "--output", str(root / "ref.png")]) == 0
    return [np.asarray(Image.open(root / f"ref-{n}.png"), dtype=np.float64) / 255 for n in range(1, len(lines) + 1)]


def _served_batches(metrics_text: str) -> dict[str, float]:
    """{replica: batches run} from dtp_serve_batch_size's count."""
    counts = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "dtp_serve_batch_size_count":
                counts[sample.labels["replica"]] = sample.value
    return counts


# ~100 s on 2 cores (a 4-rank server): `full` to keep the suite's time; run with DTP_FULL=1 (passed at the merge).
@pytest.mark.full
def test_two_replicas_of_tp_2_answer_every_request_once_and_equal_dtp_run(checkpoint):
    model_dir, root = checkpoint
    with serving(model_dir, root / "server.log", "--replicas", "2", nproc=4) as server:
        client = server.client
        health = client.get("/health").json()
        assert [r["replica"] for r in health["replicas"]] == [0, 1], health
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda body: client.post("/v1/images/generations", json=body), REQUESTS))
        health = client.get("/health").json()
        metrics = client.get("/metrics").text
    log = server.log.read_text()
    assert [a.status_code for a in answers] == [200] * len(REQUESTS), [a.text[:300] for a in answers]
    assert log.count("dtp serve: rank") == 8 and log.count(" stopped") == 4, log[-3000:]  # 4 ready, 4 stopped
    # each request was run once: one log line per request id, split over both replicas
    ran = re.findall(r"dtp serve: (replica 1: )?request (\d+): \d+ steps", log)
    assert sorted(int(n) for _, n in ran) == list(range(1, len(REQUESTS) + 1)), log[-3000:]
    assert {bool(r) for r, _ in ran} == {False, True}, log[-3000:]  # replica 0 and replica 1 both served
    done = {r["replica"]: r["done"] for r in health["replicas"]}
    assert health["done"] == sum(done.values()) == len(REQUESTS) and min(done.values()) > 0, health
    assert _served_batches(metrics) == {"0": done[0], "1": done[1]}, metrics
    references = _references(model_dir, root, REQUESTS)
    for body, answer, reference in zip(REQUESTS, answers, references, strict=True):
        pixels = _pixels(answer.json()["data"][0]["b64_json"])
        assert np.abs(pixels - reference).max() <= ONE_LEVEL + 1e-9, body
