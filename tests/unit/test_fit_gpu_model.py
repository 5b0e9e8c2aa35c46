"""`dtp fit` costs the code as written: eager vs compiled, latency per collective kind, fp32 FLOPs, FSDP copy-out."""

import pytest
import torch

import dtp
from dtp.fit import cost
from dtp.fit.hardware import HARDWARE

H100 = HARDWARE["H100 SXM"]
L40S = HARDWARE["L40S"]


def test_eager_compute_is_the_compiled_one_times_the_h200_ratio():
    """dtp on an H200 (gpu_check.md): 22.8 ms eager, 15.6 ms compiled: eager compute = compiled x 1.4615; the
    collectives are the same either way."""
    assert round(cost.EAGER_FACTOR, 4) == 1.4615  # 22.8 / 15.6
    records = [("all_reduce", 1 << 20, 4)]
    compiled = cost.call_seconds(10e12, 0, records, H100)
    eager = cost.call_seconds(10e12, 0, records, H100, compiled=False)
    assert eager - compiled == pytest.approx((cost.EAGER_FACTOR - 1) * 10e12 / (989e12 * 0.6))


def test_latency_per_collective_kind():
    """Every traced op name maps to its kind's small-message latency (NVLink: all-reduce 25 us, all-gather 20,
    all-to-all 30, send / recv 15); PCIe twice that."""
    expected = {
        "allreduce": 25e-6,
        "all_reduce": 25e-6,
        "all_gather_into_tensor": 20e-6,
        "allgather": 20e-6,
        "alltoall_base": 30e-6,
        "all_to_all_single": 30e-6,
        "reduce_scatter_tensor": 20e-6,
        "send": 15e-6,
        "recv": 15e-6,
    }
    for op, alpha in expected.items():
        assert cost.latency(op, H100) == pytest.approx(alpha), op
        assert cost.latency(op, L40S) == pytest.approx(2 * alpha), op
    assert cost.collective_seconds([("alltoall_base", 0, 8), ("send", 0, 2), ("allreduce", 0, 1)], H100) == (
        pytest.approx(45e-6)  # a group of one rank sends nothing
    )


def test_fp32_flops_run_at_the_fp32_rate():
    """1 TFLOP of fp32 matmuls (no tensor cores) on an H100: 1e12 / (67e12 x 0.6) = 24.9 ms, 14.8x the bf16 time."""
    bf16 = cost.compute_seconds(1e12, 0, H100)
    fp32 = cost.compute_seconds(1e12, 0, H100, fp32_flops=1e12)
    assert fp32 == pytest.approx(1e12 / (67e12 * 0.6))
    assert fp32 / bf16 == pytest.approx(989 / 67)


def test_fsdp_copy_out_reads_and_writes_every_unit():
    """Two 0.5 GB units on an H100 (3.35 TB/s): 2 x 1 GB / 3.35 TB/s = 0.597 ms per call."""
    assert cost.fsdp_copy_out_seconds([5e8, 5e8], H100) == pytest.approx(2e9 / 3.35e12)


@pytest.fixture(scope="module")
def tiny_fit():
    from dtp.families.pipelines import tiny_checkpoint
    from dtp.fit.measure import Measurer
    from dtp.fit.pipelines import fit_pipeline

    directory = str(tiny_checkpoint("flux"))
    measurer = Measurer(fit_pipeline(directory), torch.bfloat16)
    options = dict(height=64, width=64, dtype="bf16", measurer=measurer, hardware="H100 SXM")
    options["only"] = {"cp": 1, "quant": None, "text_encoders": "whole"}
    return lambda **extra: dtp.fit(directory, 2, "1GB", **options, **extra)


def test_rows_say_eager_or_compiled_and_eager_is_slower_by_the_ratio(tiny_fit):
    """The tiny FLUX.1 checkpoint at tp=2, bf16: every row says compiled or not; the eager row's step exceeds the
    compiled one's by (1.46 - 1) x its compute; the transformer was traced on fake CUDA tensors and its attention ran
    FlashAttention-2; the compiled row's command adds --compile."""
    compiled, eager = tiny_fit(compile=True), tiny_fit()
    (c,), (e,) = compiled["rows"], eager["rows"]
    assert c["compiled"] is True and e["compiled"] is False and compiled["compiled"] and not eager["compiled"]
    compute = cost.compute_seconds(c["step_flops"], c["weight_bytes"]["transformer"], H100)
    assert e["step_seconds"] - c["step_seconds"] == pytest.approx(c["calls_per_step"] * compute * 0.4615, rel=1e-3)
    assert c["traced_on"] == "cuda" and c["step_fp32_flops"] == 0
    assert set(c["attention_kernels"]) == {"_scaled_dot_product_flash_attention bfloat16"}
    assert c["command"].endswith("--compile") and "--compile" not in e["command"]
