"""The order in which `-n 2 --dist loadfile` hands modules to the two workers: tests/distributed's first.

xdist hands out whole modules, most tests first. The gloo and torchrun modules with one to six tests (test_plan_fuzz,
test_compile, test_two_nodes, test_serve_video, test_run_kinds: 15-75 s each on the idle machine) came last, after
fifty unit modules of a few seconds, so one worker could run a minute alone at the end while the other had finished.
Handed out first, they run while there is still other work; the many short unit modules, last, even out the end.
Within each folder xdist's own order stays (most tests first).
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

FIRST = "distributed/"  # a module whose path holds this is handed out before every other


class DistributedFirst(LoadFileScheduling):
    """`--dist loadfile`, the modules under tests/distributed before the others."""

    def _assign_work_unit(self, node) -> None:
        first = next((module for module in self.workqueue if FIRST in module), None)
        if first is not None:
            self.workqueue.move_to_end(first, last=False)  # xdist assigns the queue's first module
        super()._assign_work_unit(node)
