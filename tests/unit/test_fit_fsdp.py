"""`dtp fit`'s FSDP model (`fit/fsdp.py`) on a hand-made row: the numbers its docstring promises, computed here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dtp.fit import fsdp as fsdp_model  # `import dtp.fit.fsdp as` would meet dtp.fit, the function
from dtp.fit.candidates import Candidate
from dtp.fit.hardware import hardware

GB = 10**9
PIPE = SimpleNamespace(transformer="transformer", text_encoders=("text_encoder",), name="p", model_dir="d")
PLAN = SimpleNamespace(resident={"transformer": {"text", "denoise", "decode"}, "text_encoder": {"text", "denoise",
                       "decode"}, "vae": {"text", "denoise", "decode"}})  # fmt: skip
ROW = dict(
    weight_bytes={"transformer": 24 * GB, "text_encoder": 8 * GB, "vae": 1 * GB},
    phase_bytes={"text": 1 * GB, "denoise": 2 * GB, "decode": 3 * GB},
    step_seconds=1.0,
    calls_per_step=1,
    step_collective_bytes=0,
)


@pytest.fixture(autouse=True)
def blocks(monkeypatch):
    """The transformer: 60 blocks of 1.6 % each (96 % of it), the root the other 4 %."""
    monkeypatch.setattr(fsdp_model, "block_fraction", lambda *a: (0.016, 0.96, 60))


def test_weights_peak_and_gathered_bytes():
    c = Candidate(cp=8, tp=1, cp_mode="ulysses", text_encoders="sharded", fsdp=True)
    row = fsdp_model.fsdp_row(ROW, c, PIPE, PLAN, 1.0, None, hardware("H100 SXM", 80 * GB), 80 * GB)
    transformer = int(24 * GB * (0.96 / 8 + 0.04))  # blocks divided by 8, the root whole
    assert row["weight_bytes"] == {"transformer": transformer, "text_encoder": GB, "vae": GB}
    transient = int(2 * 0.016 * 24 * GB)  # the running block and the prefetched one, while denoising
    denoise = transformer + 2 * GB + transient + 2 * GB
    decode = transformer + 2 * GB + transient // 2 + 3 * GB
    assert row["peak_bytes"] == max(denoise, decode)
    assert row["fsdp_gathered_bytes"] == int(7 / 8 * int(24 * GB * 0.96))
    assert row["step_seconds"] == 1.0  # 20 GB over NVLink in less than the call's 1 s: hidden by prefetch


def test_exposed_gather_when_the_link_is_slow():
    """A call shorter than its gather: the difference is exposed."""
    c = Candidate(cp=8, tp=1, cp_mode="ulysses", fsdp=True)
    row = fsdp_model.fsdp_row(ROW, c, PIPE, PLAN, 0.001, None, hardware("H100 SXM", 80 * GB), 80 * GB)
    assert row["step_seconds"] > 1.0


@pytest.mark.parametrize(
    "candidate,reason",
    [
        (Candidate(tp=8, fsdp=True), "no non-tp axis"),
        (Candidate(cp=2, tp=4, cp_mode="ring", quant="int8wo", fsdp=True), "torchao"),
        (Candidate(cp=2, tp=4, cp_mode="ring", fsdp=True), None),
        (Candidate(cfg=2, tp=4, fsdp=True), None),
    ],
)
def test_supported(candidate, reason):
    found = fsdp_model.fsdp_supported(PIPE, candidate)
    assert (found is None) if reason is None else (reason in found)
