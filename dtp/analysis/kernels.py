"""`dtp check --kernels`: what a GPU would run, per block, read off one forward traced on fake CUDA tensors.

The forward is `dtp check`'s own (the sharded model, whole depth, its cp hooks) with every tensor a fake CUDA tensor
(`trace.to_fake(..., "cuda")`, `cuda.CudaRoute`): dtp's and diffusers' CUDA branches run, and scaled-dot-product
attention takes the kernel a CUDA build of torch picks (`cuda.sdpa_kernel_choice`). Per block (an element of a
block list; blocks with the same figures are one row, `blocks` of them), from `trace.Trace.kernels` and its
collectives:

    attention     the aten op of each attention call and its dtype: `_scaled_dot_product_flash_attention`
                  (FlashAttention-2), `_efficient_attention`, `_cudnn_attention` are fused; `_safe_softmax` is SDPA's
                  math path (scores materialized); none at all with fp32 matmuls is an attention done by hand (dtp's
                  ring block before its fused kernels: `bmm` on upcast q, k, v)
    matmul        mm / addmm / bmm / convolution calls by input dtype (float32 ones run without tensor cores)
    collectives   by op, every process group (tp, cp)
    sync          where the host waits for the device: `_local_scalar_dense` (.item(), bool of a tensor), `equal`,
                  device-to-host copies, ops whose output size depends on the data (nonzero, x[mask])
    h2d           host-to-device copies (blocking unless pinned)

`attention_backend(name)`: the choice a run would make (`--attention-backend`): auto (torch's order), flash,
efficient, cudnn, math (torch's `sdpa_kernel`), or a diffusers dispatcher backend name (`_native_cudnn`, ...;
diffusers' `attention_backend`, which refuses one it cannot run).
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter

from ..errors import PlanError
from .trace import Trace

FUSED = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn")
TORCH_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                  "math": "MATH"}  # fmt: skip
KINDS = ("attention", "matmul", "collectives", "sync", "h2d")
DEVICE = "cuda (fake tensors: kernels as a CUDA build of torch picks them on sm80-sm90)"


@contextlib.contextmanager
def attention_backend(name: str | None, device: str = "cuda"):
    """The attention backend `name` in force for a forward traced on fake `device` tensors (module docstring);
    PlanError for an unknown one. The choice is among CUDA kernels: on another device the name is checked only."""
    if name in (None, "auto") or (device != "cuda" and name in TORCH_BACKENDS):
        yield
        return
    if name in TORCH_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, TORCH_BACKENDS[name])):
            yield
        return
    from diffusers.models import attention_dispatch

    try:
        context = attention_dispatch.attention_backend(name)
        context.__enter__()
    except (ValueError, RuntimeError, ImportError) as exc:
        choices = ", ".join(["auto", *TORCH_BACKENDS, *(b.value for b in attention_dispatch.AttentionBackendName)])
        raise PlanError(f"--attention-backend {name}: {exc} (choices: {choices}).") from None
    if device != "cuda":
        context.__exit__(None, None, None)
        yield
        return
    try:
        yield
    finally:
        context.__exit__(None, None, None)


def kernels_report(trace: Trace, backend: str | None = None) -> dict:
    """The `kernels` section of `dtp check --json` from a trace on fake CUDA tensors (module docstring)."""
    per_scope = _per_scope(trace)
    rows = _rows(per_scope)
    totals = {kind: Counter() for kind in KINDS}
    for figures in per_scope.values():
        for kind in KINDS:
            totals[kind].update(figures[kind])
    attention = totals["attention"]
    return {
        "device": DEVICE,
        "attention_backend": backend or "auto",
        "blocks": rows,
        "totals": {kind: dict(sorted(counts.items())) for kind, counts in totals.items()},
        "fused_attention": bool(attention) and all(name.startswith(FUSED) for name in attention),
        "fp32_flop_share": sum(trace.fp32_flops.values()) / max(trace.total_flops(), 1),
    }


def _per_scope(trace: Trace) -> dict[str, dict[str, Counter]]:
    scopes: dict[str, dict[str, Counter]] = {}
    for (scope, kind, name), count in trace.kernels.items():
        scopes.setdefault(scope, {k: Counter() for k in KINDS})[kind][name] += count
    for record in trace.collectives:
        scopes.setdefault(record.scope, {k: Counter() for k in KINDS})["collectives"][record.op] += 1
    return scopes


def _rows(per_scope: dict) -> list[dict]:
    """One row per block list and distinct figures (in model order), then the code outside every block."""
    grouped: dict[tuple, dict] = {}
    for scope in sorted(per_scope, key=_order):
        figures = per_scope[scope]
        key = (re.sub(r"\.\d+$", ".*", scope) or "outside blocks", _frozen(figures))
        row = grouped.setdefault(key, {"scope": key[0], "blocks": 0, **_plain(figures)})
        row["blocks"] += 1
    return list(grouped.values())


def _order(scope: str) -> tuple:
    match = re.search(r"^(.*)\.(\d+)$", scope)
    return (scope == "", match.group(1), int(match.group(2))) if match else (scope == "", scope, 0)


def _frozen(figures: dict) -> tuple:
    return tuple((kind, tuple(sorted(figures[kind].items()))) for kind in KINDS)


def _plain(figures: dict) -> dict:
    return {kind: dict(sorted(figures[kind].items())) for kind in KINDS}


def format_kernels(k: dict) -> list[str]:
    """The `dtp check --kernels` lines: one block of lines per row, then the verdict."""
    lines = [f"kernels on {k['device']}, attention backend {k['attention_backend']}; per block:"]
    for row in k["blocks"]:
        lines.append(f"  {row['scope']} (x{row['blocks']}):")
        for kind in KINDS:
            if row[kind]:
                lines.append(f"    {kind:<12} " + ", ".join(f"{name} x{n}" for name, n in row[kind].items()))
    if not k["totals"]["attention"]:
        fused = "none (attention computed in plain matmuls)"
    else:
        fused = "all fused" if k["fused_attention"] else "NOT all fused"
    lines.append(f"  attention kernels: {fused}; fp32 share of the FLOPs: {k['fp32_flop_share']:.1%}")
    return lines
