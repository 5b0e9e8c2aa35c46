"""One rank's forward on a fake process group, beside diffusers' unsharded model: host time and DTensor ops.

torch's fake process group answers every collective without communicating, so one process runs exactly the code
rank 0 of a `tp x cp x cfg` mesh runs, minus the network. At tiny widths the forward's time is host time (Python,
dispatch, launches), which does not shrink with the widths: a ratio measured here holds at full size, where a GPU
forward of FLUX.1-dev at tp >= 2 takes tens of ms and eager host overhead would set the step time.

Used by `tests/distributed/test_local_forward.py` (no aten op takes a DTensor) and `benchmarks/host_overhead.py`
(the ratios).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..families import FAMILIES, example_inputs, model_class


class DTensorOps(TorchDispatchMode):
    """Counts every aten op called with a DTensor among its arguments (`self.ops`: op name -> calls).

    A mode sees an op before any tensor subclass does, so a DTensor argument shows here however DTensor then
    dispatches it."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.total += 1
        if any(isinstance(t, DTensor) for t in tree_leaves((args, kwargs))):
            self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)


@dataclass(frozen=True)
class Mesh:
    """One sharding of the benchmark: degrees and options, as `dtp.make_mesh` / `dtp.parallelize` take them."""

    name: str
    tp: int = 1
    cp: int = 1
    cfg: int = 1
    cp_mode: str = "ulysses"
    fsdp: bool | int | str = False  # or a unit size (runtime/fsdp_unit.py)

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.cfg


MESHES = (
    Mesh("tp=2", tp=2),
    Mesh("cp=2 ulysses", cp=2),
    Mesh("cp=2 ring", cp=2, cp_mode="ring"),
    Mesh("cfg=2", cfg=2),
    Mesh("cp=2 fsdp", cp=2, fsdp=True),
)


def tiny_model(class_name: str) -> torch.nn.Module:
    """The family's TINY model, seed 0, eval mode."""
    torch.manual_seed(0)
    return model_class(class_name).from_config(FAMILIES[class_name].tiny).eval()


def tiny_inputs(class_name: str, mesh: Mesh) -> dict:
    """Forward kwargs of the TINY model: a batch of `cfg` (a cfg mesh splits the batch), 16 image tokens."""
    return example_inputs(class_name, FAMILIES[class_name].tiny, batch=mesh.cfg, img_tokens=16, txt_tokens=8)


def sharded_pair(class_name: str, mesh: Mesh):
    """(diffusers' model, the same weights sharded by dtp on rank 0 of `mesh`); call inside `fake_world(mesh.world)`."""
    import dtp

    reference = tiny_model(class_name)
    device_mesh = dtp.make_mesh(tp=mesh.tp, cp=mesh.cp, cfg=mesh.cfg, device_type="cpu")
    sharded = dtp.parallelize(copy.deepcopy(reference), device_mesh, cp_mode=mesh.cp_mode, fsdp=mesh.fsdp)
    return reference, sharded


def dtensor_ops(model: torch.nn.Module, inputs: dict) -> DTensorOps:
    """The ops of one forward of `model` (no grad) that took a DTensor argument."""
    with torch.no_grad(), DTensorOps() as counter:
        model(**inputs)
    return counter


def alternated_medians(first, second, inputs: dict, repeats: int = 21, warmup: int = 3) -> tuple[float, float]:
    """Median seconds of `first(**inputs)` and `second(**inputs)`, called in turn `repeats` times (no grad).

    Seconds of this thread's CPU time (`time.thread_time`), not wall time: on a shared machine the wall time of a call
    includes the time the thread waited for a core, which differs between neighbouring calls by more than the
    difference measured here; with one torch thread and a fake process group the whole forward runs on this thread."""
    times: tuple[list[float], list[float]] = ([], [])
    with torch.no_grad():
        for i in range(warmup + repeats):
            for model, out in ((first, times[0]), (second, times[1])):
                start = time.thread_time()
                model(**inputs)
                if i >= warmup:
                    out.append(time.thread_time() - start)
    return statistics.median(times[0]), statistics.median(times[1])
