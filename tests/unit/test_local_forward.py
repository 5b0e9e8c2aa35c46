"""The sharded forward on plain tensors: at tp=2 (fake process group) no aten op of a FLUX.1 or Wan forward takes a
DTensor argument, while the parameters stay DTensors at rest."""

import pytest
import torch
from torch.distributed.tensor import DTensor

from dtp.analysis.fakepg import fake_world
from dtp.styles.collectives import all_gather_along, along_last
from dtp.testing.host import MESHES, DTensorOps, dtensor_ops, sharded_pair, tiny_inputs

TP2 = next(m for m in MESHES if m.name == "tp=2")


@pytest.mark.parametrize("class_name", ["FluxTransformer2DModel", "WanTransformer3DModel"])
def test_no_aten_op_takes_a_dtensor_at_tp2(class_name):
    """Tiny FLUX.1 / Wan at tp=2: 0 ops of a forward on DTensors; the sharded weights are still DTensors."""
    with fake_world(TP2.world):
        _, sharded = sharded_pair(class_name, TP2)
        counter = dtensor_ops(sharded, tiny_inputs(class_name, TP2))
        weights = [p for p in sharded.parameters() if isinstance(p, DTensor)]
        with DTensorOps() as control:  # the counter sees a DTensor argument when there is one
            weights[0] * 2
    assert counter.total > 100 and not counter.ops, counter.ops
    assert len(weights) > 10 and sum(control.ops.values()) == 1


@pytest.mark.parametrize("shape", [(1, 4), (3, 4), (2, 3, 5), (1, 1, 6)])
def test_along_last_is_the_concatenation_of_the_rank_pieces(shape):
    """Pieces stacked on dim 0 (what the all-gather writes) come out as `torch.cat(pieces, -1)`, one row or several."""
    pieces = [torch.randn(shape) for _ in range(3)]
    assert torch.equal(along_last(torch.cat(pieces, 0), 3), torch.cat(pieces, -1))
    assert not torch.equal(along_last(torch.cat(pieces[::-1], 0), 3), torch.cat(pieces, -1))  # order matters


class _ThreeRanks:
    """A stand-in process group of 3 ranks whose all-gather writes rank r's piece as `tensor + 100 r` (rank order)."""

    def size(self):
        return 3

    def all_gather_single(self, gathered, tensor):
        torch.cat([tensor + 100 * r for r in range(3)], 0, out=gathered)
        return self

    def wait(self):
        return True


@pytest.mark.parametrize("shape,dim", [((1, 4, 2), 1), ((2, 4, 2), 1), ((3, 4), 0), ((1, 1, 5), -1), ((2, 3, 5), 2)])
def test_all_gather_along_is_the_concatenation_of_the_rank_pieces(shape, dim):
    """Straight into the result when the dims before `dim` are 1, through a stacked buffer otherwise: both give
    `torch.cat(pieces, dim)`; the order of the pieces matters (control)."""
    tensor = torch.randn(shape)
    pieces = [tensor + 100 * r for r in range(3)]
    gathered = all_gather_along(tensor, _ThreeRanks(), dim)
    assert torch.equal(gathered, torch.cat(pieces, dim))
    assert not torch.equal(gathered, torch.cat(pieces[::-1], dim))
