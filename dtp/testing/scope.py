"""Which cases the suite runs. The default run keeps one case of each kind (a model, a mesh, a config); the
further cases of a covered kind run with DTP_FULL=1 (`pytest.mark.full`, and spawned groups that do less work)."""

import os


def full_run() -> bool:
    """True when DTP_FULL=1: every case, not one per kind."""
    return os.environ.get("DTP_FULL") == "1"
