"""Quantized weights under TP at a padded degree: tp=3 on 3 gloo processes, pad=True (heads 4 -> 6).

Padded rows hold qdata 0 with scale 1 (quantize then shard) or the scheme's own scale of a zero row
(shard then quantize); both give exact zeros. Tiny FLUX.1, FLUX.2 and Qwen-Image, int8 and float8
weight-only, both orders: max |sharded - ref| <= 1e-5 * max |ref| against the one-process quantized model.
"""

import pytest

pytest.importorskip("torchao")

from quant_cases import CLASSES, ORDERS, run_quant_cases  # noqa: E402

import dtp  # noqa: E402
from dtp.testing.launch import spawn  # noqa: E402

TOL = 1e-5
SCHEMES = ("int8wo", "fp8wo")


def _run(rank, world_size):
    import warnings

    warnings.filterwarnings("ignore", module="torchao")
    return run_quant_cases(dtp.make_mesh(tp=3)["tp"], SCHEMES, pad=True, controls=False)


@pytest.fixture(scope="module")
def results():
    return spawn(_run, 3)


@pytest.mark.parametrize("case", [f"{n}/{s}/{o}" for n in CLASSES for s in SCHEMES for o in ORDERS])
def test_quantized_parity_padded(results, case):
    for r in results:
        found = r[case]
        print(f"tp=3 pad {case}: {found['relative']:.2e} vs one process; scheme's own error {found['quant_error']:.2e}")
        assert found["relative"] <= TOL, (case, found)
        assert found["quant_error"] > 100 * TOL and found["sharded_quantized"] > 0, found


def test_full_weights_exact_padded(results):
    """Padding dropped again: full_tensor of each padded quantized weight is the unpadded one, bit for bit."""
    assert all(r["full_weights_exact"] for r in results)
