"""`dtp fit`'s FSDP model (`fit/fsdp.py`) on a hand-made row and hand-made traced figures: the numbers its docstring
promises, computed here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dtp.analysis.fsdp import FsdpFigures
from dtp.fit import cost
from dtp.fit import fsdp as fsdp_model  # `import dtp.fit.fsdp as` would meet dtp.fit, the function
from dtp.fit.candidates import Candidate
from dtp.fit.hardware import hardware
from dtp.fit.measure import Setup

GB = 10**9
PIPE = SimpleNamespace(transformer="transformer", text_encoders=("text_encoder",), name="p", model_dir="d")
PHASES = {"text", "denoise", "decode"}
PLAN = SimpleNamespace(
    resident={"transformer": PHASES, "text_encoder": PHASES, "vae": PHASES},
    setups={"transformer": Setup(), "text_encoder": Setup(), "vae": Setup()},
)
ROW = dict(
    weight_bytes={"transformer": 24 * GB, "text_encoder": 8 * GB, "vae": 1 * GB},
    phase_bytes={"text": 1 * GB, "denoise": 2 * GB, "decode": 3 * GB},
    step_seconds=1.0,
    calls_per_step=1,
    step_collective_bytes=0,
)
UNIT = 4 * 10**8  # the transformer: 60 units of 0.4 GB, two in flight; the text encoder 0.8 GB in flight
TRACED = {
    "transformer": FsdpFigures(8, 3 * GB, 3 * GB, 2 * UNIT, (UNIT,) * 60, UNIT),
    "text_encoder": FsdpFigures(8, 12 * 10**8, GB, 8 * 10**8, (UNIT,) * 20, UNIT),
}
H100 = hardware("H100 SXM", 80 * GB)
COMPONENT_FIGURES = fsdp_model.component_figures  # the real one, before the fixture replaces it


@pytest.fixture(autouse=True)
def traced(monkeypatch):
    monkeypatch.setattr(fsdp_model, "component_figures", lambda pipeline, name, *a: TRACED.get(name))


def test_weights_peak_and_gathered_bytes():
    c = Candidate(cp=8, tp=1, cp_mode="ulysses", text_encoders="sharded", fsdp=True)
    row = fsdp_model.fsdp_row(ROW, c, PIPE, PLAN, 1.0, None, H100, 80 * GB)
    assert row["weight_bytes"] == {"transformer": 3 * GB, "text_encoder": 12 * 10**8, "vae": GB}  # traced
    resident = 3 * GB + 12 * 10**8 + GB
    text, denoise, decode = resident + 8 * 10**8 + GB, resident + 2 * UNIT + 2 * GB, resident + 3 * GB
    assert row["peak_bytes"] == max(text, denoise, decode) == decode  # nothing gathered in the decode
    assert row["fsdp_in_flight_bytes"] == {"text": 8 * 10**8, "denoise": 2 * UNIT, "decode": 0}
    assert row["fsdp_gathered_bytes"] == int(7 / 8 * 60 * UNIT)
    # 24 GB over NVLink in less than the call's 1 s: hidden by prefetch; FSDP2's copy-out is not (it runs on the
    # compute stream): 2 x 60 units x 0.4 GB / 3.35 TB/s = 14.3 ms.
    assert row["step_seconds"] == pytest.approx(1.0 + 2 * 60 * UNIT / 3.35e12)


def test_text_encoders_whole_are_not_traced():
    c = Candidate(cp=8, tp=1, cp_mode="ulysses", text_encoders="whole", fsdp=True)
    row = fsdp_model.fsdp_row(ROW, c, PIPE, PLAN, 1.0, None, H100, 80 * GB)
    assert row["weight_bytes"]["text_encoder"] == 8 * GB and row["fsdp_in_flight_bytes"]["text"] == 0


def test_exposed_gather_when_the_link_is_slow():
    """A call shorter than its gathers: the difference is exposed, and the copy-out on top."""
    c = Candidate(cp=8, tp=1, cp_mode="ulysses", fsdp=True)
    row = fsdp_model.fsdp_row(ROW, c, PIPE, PLAN, 0.001, None, H100, 80 * GB)
    gather = cost.collective_seconds([("all_gather", UNIT, 8)] * 60, H100)
    assert row["step_seconds"] == pytest.approx(1.0 + gather - 0.001 + cost.fsdp_copy_out_seconds([UNIT] * 60, H100))


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


def test_a_mesh_without_cp_is_traced():
    """cfg=2 with no cp axis (cp_mode None on the candidate): traced, not refused ('cp_mode must be one of ...' hid
    every cfg-only fsdp row of Qwen-Image and Wan once); tiny FLUX.1 on a fake world."""
    from dtp.testing.tiny import tiny_model

    flux = "FluxTransformer2DModel"
    pipeline = SimpleNamespace(name="tiny", model_dir="-", build=lambda name, dtype: tiny_model(flux))
    c = Candidate(cfg=2, tp=1, fsdp=True)
    assert c.cp_mode is None
    figures = COMPONENT_FIGURES(pipeline, "transformer", c, Setup(), None)
    whole = sum(p.numel() * 4 for p in tiny_model(flux).parameters())
    assert figures.fsdp == 2 and 0 < figures.resident < whole


def test_unit_size_reaches_the_traced_figures(monkeypatch):
    """`fsdp_row(..., unit=4)` traces every sharded component at that unit size (`component_figures`' unit), as
    `dtp fit --fsdp-unit 4` asks; the row's command runs it (`--fsdp 4`)."""
    from dtp.fit.estimate import RunOptions, command
    from dtp.fit.pipelines import Shape, fit_pipeline

    asked = []
    monkeypatch.setattr(
        fsdp_model, "component_figures", lambda p, name, c, s, d, unit=True: asked.append(unit) or TRACED.get(name)
    )
    c = Candidate(cp=8, tp=1, cp_mode="ulysses", text_encoders="sharded", fsdp=True)
    fsdp_model.fsdp_row(ROW, c, PIPE, PLAN, 1.0, None, H100, 80 * GB, unit=4)
    assert asked == [4, 4]  # the transformer and the sharded text encoder
    shape = Shape(1, 1024, 1024)
    assert command(c, fit_pipeline("flux-pipeline"), shape, run=RunOptions(fsdp_unit=4)).endswith("--fsdp 4")
    assert command(c, fit_pipeline("flux-pipeline"), shape).endswith("--fsdp")
