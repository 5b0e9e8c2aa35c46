"""pad=True on 3 gloo processes: the tiny configs (4 heads, FFN widths 256/384) at tp=3, where nothing divides."""

import pytest

import dtp
from dtp.testing.launch import spawn
from dtp.testing.parity import forward_parity
from dtp.testing.tiny import PLAN_CLASSES, tiny_inputs, tiny_model

TOL = 1e-5


def _run(rank, world_size):
    mesh = dtp.make_mesh(tp=3, cp=1, device_type="cpu")
    results = {}
    for plan_name, cls in PLAN_CLASSES.items():
        make = lambda cls=cls: tiny_model(cls)  # noqa: E731 (one fresh model per call)
        inputs = tiny_inputs(cls, batch=2)
        results[plan_name] = forward_parity(make, inputs, mesh, dtp.load_plan(plan_name), pad=True).relative
    return results


@pytest.fixture(scope="module")
def results():
    return spawn(_run, 3)


@pytest.mark.parametrize("plan_name", list(PLAN_CLASSES))
def test_padded_parity_tp3(results, plan_name):
    """Tiny configs at tp=3, pad=True (heads 4 -> 6; FFN, packed proj_out [attn | mlp], SwiGLU blocks and
    gathered AdaLN / context_embedder widths padded): max |sharded - ref| <= 1e-5 * max |ref|, batch 2."""
    for r in results:
        assert r[plan_name] <= TOL, (plan_name, r[plan_name])
