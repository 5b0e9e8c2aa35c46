"""dtp.testing.launch.spawn: results in rank order, and failures surface fast with the rank that failed."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from dtp.testing.launch import spawn


def _sum_of_ranks(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return {"rank": rank, "sum": float(t)}


def _rank1_raises(rank, world_size):
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def _rank1_dies(rank, world_size, death_file):
    if rank == 1:
        with open(death_file, "w") as f:
            f.write(repr(time.time()))
        os._exit(3)  # no traceback, no report: only the exit code tells
    time.sleep(300)  # rank 0 would wait here; spawn must not wait for it
    return rank


def test_results_in_rank_order_after_a_collective():
    assert spawn(_sum_of_ranks, 3) == [{"rank": r, "sum": 3.0} for r in range(3)]


def test_a_raising_rank_is_reported_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 failed:.*ValueError: boom on rank 1"):
        spawn(_rank1_raises, 2)


def test_a_rank_that_dies_silently_fails_the_call_quickly(tmp_path):
    """Within 25 s of the death, timed from the death: process start-up on a loaded machine took 45 s once."""
    death_file = tmp_path / "died_at"
    with pytest.raises(RuntimeError, match="rank 1 died with exit code 3"):
        spawn(_rank1_dies, 2, str(death_file))
    assert time.time() - float(death_file.read_text()) < 25
