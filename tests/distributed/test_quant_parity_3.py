"""Quantized weights under TP at a padded degree: tp=3 on 3 gloo processes, pad=True (heads 4 -> 6).

Padded rows hold qdata 0 with scale 1 (quantize then shard) or the scheme's own scale of a zero row
(shard then quantize); both give exact zeros. Tiny FLUX.1, FLUX.2 and Qwen-Image, int8 and float8
weight-only, both orders: max |sharded - ref| <= 1e-5 * max |ref| against the one-process quantized model.
"""

import pytest

pytest.importorskip("torchao")

from quant_cases import CLASSES, ORDERS, load_parity, run_quant_cases  # noqa: E402

import dtp  # noqa: E402
from dtp.testing.launch import spawn  # noqa: E402
from dtp.testing.scope import full_run  # noqa: E402
from dtp.testing.tiny import tiny_model  # noqa: E402

TOL = 1e-5
SCHEMES = ("int8wo", "fp8wo")
# Padded tp=3 by default on FLUX.1 (its padded heads); FLUX.2 and Qwen-Image with DTP_FULL=1.
PADDED_CLASSES = tuple(CLASSES) if full_run() else ("flux",)
# Padded shard-on-load by default with int8 weight-only; float8 weight-only (the same TorchAoConfig path, another
# config; its padded rows are exact in test_quantized_parity_padded) with DTP_FULL=1.
LOAD_SCHEMES = SCHEMES if full_run() else ("int8wo",)


def _run(rank, world_size, path):
    import warnings

    warnings.filterwarnings("ignore", module="torchao")
    mesh = dtp.make_mesh(tp=3)["tp"]
    results = run_quant_cases(mesh, SCHEMES, pad=True, controls=False, classes=PADDED_CLASSES)
    results["load"] = {scheme: load_parity(path, mesh, scheme, pad=True) for scheme in LOAD_SCHEMES}
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("flux")
    tiny_model(CLASSES["flux"]).save_pretrained(path, safe_serialization=True)
    return spawn(_run, 3, str(path), timeout_s=1800)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(f"{n}/{s}/{o}", marks=() if n in PADDED_CLASSES else pytest.mark.full)
        for n in CLASSES
        for s in SCHEMES
        for o in ORDERS
    ],
)
def test_quantized_parity_padded(results, case):
    for r in results:
        found = r[case]
        print(
            f"tp=3 pad {case}: {found['relative']:.2e} vs one process (worst layer {found['layers']:.2e}); "
            f"scheme's own error {found['quant_error']:.2e}"
        )
        assert found["relative"] <= TOL and found["layers"] <= TOL, (case, found)
        assert found["quant_error"] > 100 * TOL and found["sharded_quantized"] > 0, found


def test_full_weights_exact_padded(results):
    """Padding dropped again: full_tensor of each padded quantized weight is the unpadded one, bit for bit."""
    assert all(r["full_weights_exact"] for r in results)


LOAD_CASES = [pytest.param(s, marks=() if s in LOAD_SCHEMES else pytest.mark.full) for s in SCHEMES]


@pytest.mark.parametrize("scheme", LOAD_CASES)
def test_from_pretrained_quantized_padded(results, scheme):
    """Shard-on-load with TorchAoConfig at tp=3, pad=True: bit-exact weights, forward within 1e-5 of diffusers'."""
    for r in results:
        found = r["load"][scheme]
        print(f"tp=3 pad from_pretrained {scheme}: {found['relative']:.2e} vs diffusers' one-process load")
        assert found["weights_exact"] and found["quantized"] > 0 and found["relative"] <= TOL, found
