"""Peak activation memory per rank for a long sequence at (cp, tp) in {(1, 4), (2, 2), (4, 1)}.

Model: FLUX.1 architecture with a small width (8 heads x 32 = 256) and 2 + 2 blocks, one forward of
8192 image + 256 text tokens (8448 tokens) on 4 gloo processes. Two numbers per rank:
- live: peak bytes of tensor storages created during the forward and still alive, tracked by a
  TorchDispatchMode (each new storage counted once, released when it is freed; excludes gloo's
  internal buffers and tensors alive before the forward);
- rss: peak resident memory (VmHWM after a reset) minus resident memory before the forward
  (includes allocator and gloo overheads; Linux only).
Table columns give the largest value over the 4 ranks. Usage:

    python benchmarks/cp_memory.py [--img-tokens 8192] [--txt-tokens 256]

Writes benchmarks/results/cp_memory.md.
"""

from __future__ import annotations

import argparse
import gc
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

import dtp
from dtp.testing.launch import spawn
from dtp.testing.tiny import tiny_inputs, tiny_model

CLS = "FluxTransformer2DModel"
WIDTH = dict(num_attention_heads=8, attention_head_dim=32, axes_dims_rope=(8, 12, 12))
MESHES = ((1, 4), (2, 2), (4, 1))  # (cp, tp)
RESULT = Path(__file__).resolve().parent / "results" / "cp_memory.md"


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _storage(value):
    """The storage of a dense tensor (Parameters included); None for non-tensors and wrapper subclasses."""
    if not isinstance(value, torch.Tensor) or is_traceable_wrapper_subclass(value):
        return None
    return value.untyped_storage()


class LiveBytes(TorchDispatchMode):
    """Peak bytes of storages that ops create while the mode is active and that are still alive.

    Views and in-place results share a storage already counted or an input's (skipped); a storage is released through a
    weakref finalizer (torch keeps one Python object per storage, so the finalizer fires on free).
    """

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._counted: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # A view or in-place result of an input (e.g. `weight.t()`) allocates nothing new.
        inputs = {_storage(t).data_ptr() for t in tree_flatten((args, kwargs))[0] if _storage(t) is not None}
        for tensor in tree_flatten(out)[0]:
            storage = _storage(tensor)
            if storage is not None and storage.data_ptr() not in inputs:
                self._count(storage)
        return out

    def _count(self, storage) -> None:
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in self._counted:
            return
        self._counted.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._release, key, nbytes)

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._counted.discard(key)


@torch.no_grad()
def _measure(model, inputs) -> dict:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    rss_before = _status_kib("VmRSS")
    start = time.perf_counter()
    with LiveBytes() as live:
        model(**inputs)
    seconds = time.perf_counter() - start
    rss_peak = _status_kib("VmHWM")
    return dict(live=live.peak, rss=(rss_peak - rss_before) * 1024, seconds=seconds)


def _worker(rank: int, world: int, img_tokens: int, txt_tokens: int) -> dict:
    inputs = tiny_inputs(CLS, img_tokens=img_tokens, txt_tokens=txt_tokens)
    inputs["txt_ids"] = torch.zeros(txt_tokens, 3)
    results = {}
    for cp, tp in MESHES:
        mesh = dtp.make_mesh(tp=tp, cp=cp)
        for mode in ("ulysses", "ring") if cp > 1 else ("ulysses",):
            model = dtp.parallelize(tiny_model(CLS, **WIDTH), mesh, cp_mode=mode)
            results[(cp, tp, mode if cp > 1 else "-")] = _measure(model, inputs)
            del model
    return results


def _table(per_rank: list[dict], tokens: int) -> str:
    mib = 1 << 20
    lines = [
        f"Flux architecture, width 256 (8 heads x 32), 2 + 2 blocks, {tokens} tokens, fp32, 4 gloo ranks (CPU).",
        "Peak activation memory per rank (max over ranks), MiB: live = tensor storages (dispatch mode), "
        "rss = resident-memory high-water mark (allocator reuse makes it noisy). forward s: that one forward's "
        "wall time on 2 shared cores, the first row including first-call warm-up; not a speed benchmark.",
        "TP (cp=1) keeps per-token activations (hidden states, norms, residuals) whole on every rank and splits "
        "only heads and MLP width; CP cuts every per-token activation by cp.",
        "",
        "| cp | tp | cp_mode | live MiB | rss MiB | forward s |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for key in per_rank[0]:
        cp, tp, mode = key
        live = max(r[key]["live"] for r in per_rank) / mib
        rss = max(r[key]["rss"] for r in per_rank) / mib
        secs = max(r[key]["seconds"] for r in per_rank)
        lines.append(f"| {cp} | {tp} | {mode} | {live:.1f} | {rss:.1f} | {secs:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img-tokens", type=int, default=8192)
    parser.add_argument("--txt-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    per_rank = spawn(_worker, 4, args.img_tokens, args.txt_tokens, backend="gloo")
    table = _table(per_rank, args.img_tokens + args.txt_tokens)
    command = f"python benchmarks/cp_memory.py --img-tokens {args.img_tokens} --txt-tokens {args.txt_tokens}"
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(f"# CP memory\n\nCommand: `{command}` (torch {torch.__version__}).\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
