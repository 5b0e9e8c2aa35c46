"""`dtp fit`'s measurements kept on disk, so a second `dtp fit` of the same pipeline costs no traces.

One JSON file per (component, `Setup`, `Shape`, dtype) under `$DTP_CACHE/fit/` (default `~/.cache/dtp/fit/`),
named by a hash of everything the figures depend on:

    the pipeline         its released name, or the text of the component's config.json in a directory
    the code             dtp's source and bundled plans (every *.py and *.yaml file's bytes) and torch's,
                         diffusers' and transformers' versions: any change measures again
    the measurement      component name, class, setup, shape, dtype

`DTP_FIT_CACHE=0` turns it off (`Measurer(..., cache=False)` too). A file that cannot be read is measured again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from functools import cache
from pathlib import Path

from ..families.pipelines import cache_dir

PACKAGE = Path(__file__).resolve().parents[1]
PLANS = PACKAGE.parent / "plans"


def enabled() -> bool:
    return os.environ.get("DTP_FIT_CACHE", "1") != "0"


@cache
def code_version() -> str:
    """A hash of dtp's sources and bundled plans and of the libraries' versions (computed once per process)."""
    import diffusers
    import torch
    import transformers

    digest = hashlib.sha256(f"{torch.__version__} {diffusers.__version__} {transformers.__version__}".encode())
    files = sorted(PACKAGE.rglob("*.py")) + sorted(PLANS.glob("*.yaml"))
    for path in files:
        digest.update(str(path.relative_to(PACKAGE.parent)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class FiguresCache:
    """get / put of `PhaseFigures` by a key of plain values (see the module docstring)."""

    def __init__(self, figures_type, directory: Path | None = None):
        self.figures_type = figures_type
        self.directory = directory or cache_dir() / "fit"

    def _path(self, key) -> Path:
        text = json.dumps([code_version(), *key], default=str, sort_keys=True)
        return self.directory / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"

    def get(self, key):
        try:
            data = json.loads(self._path(key).read_text())
            data["collectives"] = tuple(tuple(record) for record in data["collectives"])
            return self.figures_type(**data)
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def put(self, key, figures) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dataclasses.asdict(figures)))
            os.replace(tmp, path)  # concurrent writers: the last complete file wins
        except OSError:
            pass  # a read-only cache directory only costs the next run its traces
