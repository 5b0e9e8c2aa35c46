"""The root model's per-forward CP bookkeeping is one pre-hook and one `always_call` hook (`runtime/cp/root.py`):
the close runs the mask cache's close even when the scope guard's close raises, as torch ran each of the two separate
`always_call` hooks before. Tiny FLUX.1 at cp=2 on a fake process group."""

import pytest
import torch

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.runtime.cp import attention
from dtp.runtime.cp.root import RootHooks
from dtp.testing.tiny import tiny_inputs, tiny_model

CLS = "FluxTransformer2DModel"


class Boom(RuntimeError):
    pass


def _root(model) -> RootHooks:
    opens = [
        h.__self__ for h in model._forward_pre_hooks.values() if isinstance(getattr(h, "__self__", None), RootHooks)
    ]
    closes = [h.__self__ for h in model._forward_hooks.values() if isinstance(getattr(h, "__self__", None), RootHooks)]
    assert len(opens) == len(closes) == 1 and opens[0] is closes[0]
    return opens[0]


def _raising_guard_close(self, module, args, output):
    attention.ScopeGuard.__dict__["_real_close"](self, module, args, output)
    raise Boom("guard close failed")


def _close_without_finally(self, module, args, output):
    self.guard.close(module, args, output)
    self.masks.close()


@pytest.mark.parametrize("close", [None, _close_without_finally], ids=["root-close", "control-no-finally"])
def test_a_raising_guard_close_still_closes_the_mask_cache(close, monkeypatch):
    monkeypatch.setattr(attention.ScopeGuard, "_real_close", attention.ScopeGuard.close, raising=False)
    if close is not None:  # before `parallelize`: the hook registered is the bound method of that time
        monkeypatch.setattr(RootHooks, "close", close)
    with fake_world(2):
        model = dtp.parallelize(tiny_model(CLS), dtp.make_mesh(cp=2, device_type="cpu"))
        root = _root(model)
        hooks = model._forward_hooks
        assert sum(h.__self__ is root for h in hooks.values() if hasattr(h, "__self__")) == 1
        assert not any(isinstance(getattr(h, "__self__", None), attention.ScopeGuard) for h in hooks.values())
        monkeypatch.setattr(attention.ScopeGuard, "close", _raising_guard_close)
        with torch.no_grad(), pytest.raises(Boom):
            model(**tiny_inputs(CLS))
        left_open = root.masks.active
    assert attention._ACTIVE == []
    assert left_open is (close is not None)  # the control (no `finally`) leaves the mask cache open
