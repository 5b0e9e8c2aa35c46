"""The local launcher for tests and benchmarks: `dtp.analysis.launch.spawn` (N gloo processes, one group)."""

from ..analysis.launch import spawn

__all__ = ["spawn"]
