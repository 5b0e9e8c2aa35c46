"""`dtp check --quant`: every byte figure is the quantized one (torchao on the meta device)."""

import pytest

pytest.importorskip("torchao")

FLUX = "FluxTransformer2DModel"


def test_check_reports_quantized_bytes():
    """`dtp check --quant int8wo` on the tiny FLUX.1 at tp=2: total and per-rank bytes are the int8 ones
    (data 1 byte per weight + 4-byte row scales), against fp32's 4 bytes per weight."""
    from dtp.analysis.check import measure
    from dtp.testing.tiny import TINY_CONFIGS

    plain = measure(FLUX, None, tp=2, config=TINY_CONFIGS[FLUX], dtype="fp32", forward=False)
    int8 = measure(FLUX, None, tp=2, config=TINY_CONFIGS[FLUX], dtype="fp32", forward=False, quant="int8wo")
    assert int8["quant"] == "int8wo" and int8["total_bytes"] < 0.5 * plain["total_bytes"]
    assert int8["per_rank_bytes"] < 0.5 * plain["per_rank_bytes"]
    assert int8["per_rank_bytes"] < int8["total_bytes"] / 2 * 1.2, int8  # still sharded: close to total / tp
