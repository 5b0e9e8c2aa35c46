"""`fake_world` forgets DTensor's sharding-propagation caches: a DeviceMesh equals any mesh of the same layout
whatever its process groups, so an op cached in an earlier world would hand back a spec holding that world's mesh,
whose group names the next world lacks (seen as "Could not resolve the process group registered under the name 7"
when `dtp.fit` traced after other fake worlds in the same pytest worker)."""

from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from dtp.analysis.fakepg import fake_world


@contextmanager
def plain_world(size: int):
    """A fake world without dtp's cache clearing (the negative control)."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _gathered_sum(extra_groups: int):
    """In the current world: `extra_groups` groups first (so the mesh's group names differ between worlds), then a
    sharded add and the all-gather of its result over the tp dimension of a (2, 2) mesh."""
    for _ in range(extra_groups):
        dist.new_group([0, 1])
    tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))["tp"]
    x = DTensor.from_local(torch.ones(2, 3), tp, [Shard(1)], run_check=False)
    return (x + x).redistribute(tp, [Replicate()]).to_local().shape


def test_a_later_world_gets_its_own_mesh():
    with fake_world(4):
        assert _gathered_sum(extra_groups=8) == (2, 6)
    with fake_world(4):
        assert _gathered_sum(extra_groups=0) == (2, 6)


def test_without_forgetting_the_cached_spec_names_a_dead_group():
    with plain_world(4):
        _gathered_sum(extra_groups=8)
    with plain_world(4), pytest.raises(RuntimeError, match="Could not resolve the process group"):
        _gathered_sum(extra_groups=0)
    with fake_world(4):  # leaves the caches empty for the next test
        pass
