"""Count the host syncs of denoising steps: what would stall a GPU's launch queue if the tensors were on one.

    with StepSyncs(first=1, steps=4) as syncs:  # from the end of step `first - 1` to the end of step `steps - 1`
        pipe(..., num_inference_steps=4, callback_on_step_end=syncs.end_step)
    syncs.per_step()  # {"_local_scalar_dense": 0.0, "equal": 0.0, "tolist": 0.0, ...}

What is counted (every one of them drains the CUDA queue when its tensor lives on the GPU):

    _local_scalar_dense   `.item()`, `bool(t)`, `int(t)`, `float(t)` of a tensor (aten, seen by a dispatch mode)
    equal                 `torch.equal` (aten.equal reads one bool back)
    tolist                `Tensor.tolist()` (not an aten op: counted by patching the method)
    from_data             `torch.tensor(python data, device=...)` (a pageable host-to-device copy on a GPU;
                          aten.lift_fresh on the tensor it builds)
    synchronize           `torch.cuda.synchronize()` (patched; it runs nothing on a CPU-only build)

On CPU every tensor is a host tensor, so the counts are those a GPU run would make on its device tensors, with
one exception by construction: the cfg axis's host exchanges (`dtp.runtime.cfg.host.min_ints` / `max_ints` /
`gather_ints`: decision flags and output shapes) run on CPU tensors over gloo groups whatever the mesh's device,
so nothing inside them is counted. The same mode around diffusers' own one-process pipeline gives the reference
the counts are compared with.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime.cfg import host

ATEN_READS = {
    torch.ops.aten._local_scalar_dense.default: "_local_scalar_dense",
    torch.ops.aten.equal.default: "equal",
    torch.ops.aten.lift_fresh.default: "from_data",
}
HOST_SIDE = ("min_ints", "max_ints", "gather_ints")  # functions of dtp.runtime.cfg.host: CPU tensors on gloo groups
KINDS = ("_local_scalar_dense", "equal", "tolist", "from_data", "synchronize")


class StepSyncs(TorchDispatchMode):
    """Host syncs per denoising step from step `first` (0-based) to step `steps - 1` (None: to the end of the
    `with` block, the pipeline's decode included); see the module docstring."""

    def __init__(self, first: int = 1, steps: int | None = None):
        super().__init__()
        self.first, self.last = first, steps
        self.counts: Counter = Counter()
        self.steps = 0  # steps counted
        self.on = False
        self._paused = 0
        self._patches: list = []

    def count(self, kind: str) -> None:
        if self.on and not self._paused:
            self.counts[kind] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = ATEN_READS.get(func)
        if kind is not None:
            self.count(kind)
        return func(*args, **(kwargs or {}))

    @contextmanager
    def paused(self):
        """Nothing counted inside (host-side work by construction, see the module docstring)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def end_step(self, pipe, step: int, timestep, callback_kwargs):
        """The pipeline's `callback_on_step_end`: counting starts after step `first - 1`."""
        if self.on:
            self.steps += 1
        self.on = self.first <= step + 1 and (self.last is None or step + 1 < self.last)
        return callback_kwargs

    def per_step(self) -> dict[str, float]:
        return {kind: self.counts[kind] / max(self.steps, 1) for kind in KINDS}

    def __enter__(self):
        self._patch(torch.Tensor, "tolist", "tolist")
        self._patch(torch.cuda, "synchronize", "synchronize", call=False)
        for name in HOST_SIDE:
            self._pause_inside(host, name)
        return super().__enter__()

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches = []
        return super().__exit__(*exc)

    def _patch(self, owner, name: str, kind: str, call: bool = True) -> None:
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            self.count(kind)
            return original(*args, **kwargs) if call else None

        self._patches.append((owner, name, original))
        setattr(owner, name, counted)

    def _pause_inside(self, module, name: str) -> None:
        original = getattr(module, name)

        def paused(*args, **kwargs):
            with self.paused():
                return original(*args, **kwargs)

        self._patches.append((module, name, original))
        setattr(module, name, paused)
