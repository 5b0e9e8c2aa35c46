"""Shared fixtures: a single-process fake process group for checks that need a mesh but no data."""

import json
import os
import resource
import time

import pytest
import torch.distributed as dist
from hypothesis import settings

from dtp.analysis.fakepg import fake_world as dtp_fake_world
from dtp.testing.scope import full_run

# Hypothesis properties here are about values, not speed: a first call that builds a model or imports a module
# can take 0.5 s on a busy machine, which the default 200 ms deadline would report as a flaky failure.
settings.register_profile("dtp", deadline=None)
settings.load_profile("dtp")


@pytest.fixture(scope="module")
def fake_world():
    """A fake process group of size 4 (rank 0): meshes of any shape up to 4 ranks, no real collectives."""
    assert not dist.is_initialized()
    with dtp_fake_world(4):  # dtp's: it also forgets DTensor's caches of the meshes of earlier worlds in this process
        yield 4


def pytest_collection_modifyitems(config, items):
    """Cases marked `full` repeat a kind the default run already covers (another model, mesh or config): they run
    only with DTP_FULL=1, so the default run stays well under 15 minutes on 2 cores."""
    if full_run():
        return
    skip = pytest.mark.skip(reason="a further case of a covered kind: set DTP_FULL=1 to run it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (the README's command) hands out tests/distributed's modules first (tests/xdist_order.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist_order import DistributedFirst

    return DistributedFirst(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With DTP_CPU_LOG=FILE, one line per test: wall seconds and CPU seconds of this process and its waited children
    (servers, torchrun); spawned ranks log their own (`dtp.analysis.launch`). For the suite's time per module."""
    path = os.environ.get("DTP_CPU_LOG")
    if not path:
        yield
        return
    start = time.perf_counter(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    line = {
        "test": item.nodeid,
        "wall": time.perf_counter() - start[0],
        "cpu": _cpu(resource.RUSAGE_SELF) - start[1],
        "children_cpu": _cpu(resource.RUSAGE_CHILDREN) - start[2],
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _cpu(who):
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


def pytest_configure(config):
    """One intra-op thread per pytest process, as every spawned rank has (`dtp.analysis.launch`): the README's command
    runs two xdist workers on two cores, and two OpenMP threads each spin against the other worker's. Measured on
    tests/unit with `-n 2 --dist loadfile` back to back at load ~4-5: 327 s wall / 242 CPU s with torch's default
    threads, 242 s / 188 CPU s with one (docs/testing.md). The tiny models gain nothing from a second thread."""
    import torch

    torch.set_num_threads(1)
