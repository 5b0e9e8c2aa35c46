"""One place chooses the kernel of a ring block: (device type, dtype, masked, backend) -> a `BlockKernel`.

A ring block is attention of the local queries over one rank's keys that also returns the log-sum-exp
(`ring.merge` needs it). Every kernel's `run` takes `[B, H, S, D]` q, k, v (the layout the aten ops take, so that
ring attention transposes q and its K/V buffer once per attention, not per step), a per-key mask `[B, S_k]` (bool,
True = attend, or additive float) or None, and the softmax scale, and returns `(out [B, H, S_q, D_v],
lse [B, H, S_q])`; calling the `BlockKernel` itself does the same on `[B, S, H, D]` tensors (out `[B, S_q, H, D_v]`).
out in the kernel's dtype (the query dtype for the fused CUDA ops), lse in fp32. A row with no visible key
(every key of the block masked) has out = 0 and lse = -inf, whatever the kernel gives for it (efficient and
cuDNN are not specified there; the CPU kernel reports lse = 0), so it carries zero weight in the merge.

    device  dtype        mask   backend                 kernel
    cuda    bf16 / fp16  no     auto, flash             aten._scaled_dot_product_flash_attention
    cuda    bf16 / fp16  yes    auto, flash, efficient  aten._scaled_dot_product_efficient_attention (LSE sliced)
    cuda    bf16 / fp16  any    efficient               aten._scaled_dot_product_efficient_attention
    cuda    bf16 / fp16  any    cudnn                   aten._scaled_dot_product_cudnn_attention
    cuda    fp32         any    auto, flash, efficient, cudnn   efficient (flash and cuDNN take no fp32)
    cuda    head dims not multiples of 8                    `reference_block` (torch's SDPA pads them for the
                                                            fused ops; the aten ops themselves refuse them)
    cpu     any          any    all but math            aten._scaled_dot_product_flash_attention_for_cpu (fp32)
    any     any          any    math                    `reference_block` (portable fp32 math)
    other devices / dtypes                              `reference_block`

`reference_block` is the tests' reference and the kernel for devices without a fused op that returns the
log-sum-exp (XLA / Neuron, MPS, a CPU torch without the CPU flash op) and for backend "math". Backend names are
the ring families of `policy.ring_kernel_family` (None = auto).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

aten = torch.ops.aten
HALF = (torch.bfloat16, torch.float16)
FUSED_DEVICES = ("cuda",)  # device types whose SDPA aten ops below are registered (ROCm builds report "cuda" too)
MAX_SCORES = 1 << 24  # reference_block: fp32 score elements computed at once (64 MiB); query rows are chunked
HEAD_DIM_ALIGN = 8  # the CUDA flash / efficient / cuDNN aten ops take head dims that are multiples of 8
BIAS_ALIGN = 16  # the efficient kernel wants its bias rows aligned (torch's SDPA pads them: `preprocess_mask`)
CPU_FLASH = hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu")
CPU_FLASH_OP = aten._scaled_dot_product_flash_attention_for_cpu.default if CPU_FLASH else None


@dataclass(frozen=True)
class BlockKernel:
    """A ring block kernel: `name` says which aten op runs (what `dtp check --kernels` and the tests read); `run` takes
    and returns `[B, H, S, D]` (module docstring), the call `[B, S, H, D]`."""

    name: str  # "flash", "efficient", "cudnn", "cpu_flash" or "reference"
    run: Callable

    def __call__(self, q, k, v, mask, scale: float):
        out, lse = self.run(_bhsd(q), _bhsd(k), _bhsd(v), mask, scale)
        return _bhsd(out), lse

    @property
    def fused(self) -> bool:
        return self.name != "reference"


def block_kernel(
    device_type: str, dtype: torch.dtype, masked: bool, backend: str | None = None, head_dims: tuple = ()
) -> BlockKernel:
    """The kernel for a ring block (module docstring's table); `backend` is a ring family or None (auto);
    `head_dims` the q/k and v head dims (checked for the CUDA ops' alignment of 8)."""
    if backend == "math":
        return REFERENCE
    if device_type == "cpu":
        return CPU_FLASH_KERNEL if CPU_FLASH else REFERENCE
    if device_type not in FUSED_DEVICES or any(d % HEAD_DIM_ALIGN for d in head_dims):
        return REFERENCE
    if dtype not in HALF:
        return EFFICIENT if dtype == torch.float32 else REFERENCE
    if backend == "cudnn":
        return CUDNN
    if backend == "efficient" or masked:
        return EFFICIENT
    return FLASH


def _flash(q, k, v, mask, scale: float):
    assert mask is None, "flash takes no mask: block_kernel gives masked blocks to the efficient kernel"
    out, lse, *_ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
    return out, lse


def _efficient(q, k, v, mask, scale: float):
    bias = None if mask is None else additive_bias(mask, q.dtype, q.shape[1], q.shape[2])
    out, lse, *_ = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False, scale=scale)
    return _blind_rows_zero(out, lse_rows(lse, q.shape[2]), mask)


def _cudnn(q, k, v, mask, scale: float):
    bias = None if mask is None else additive_bias(mask, q.dtype, q.shape[1], q.shape[2])
    out, lse, *_ = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True, 0.0, False, False, scale=scale)
    lse = lse.squeeze(-1) if lse.ndim == 4 else lse  # [B, H, S_q, 1] in torch 2.13
    return _blind_rows_zero(out, lse, mask)


def _cpu_flash(q, k, v, mask, scale: float):
    """torch's CPU flash kernel (fp32 copies of other dtypes, one per block; CPU only), mask as a `[B, 1, 1, S_k]`
    bias. The overload is called directly (`CPU_FLASH_OP`): the packet's lookup is host time on every block."""
    if not q.dtype == k.dtype == v.dtype == torch.float32:
        q, k, v = q.float(), k.float(), v.float()  # an fp32 one is returned as it is
    if mask is None:
        return CPU_FLASH_OP(q, k, v, 0.0, False, scale=scale)
    bias = additive_bias(mask, torch.float32, 1, 1)
    out, lse = CPU_FLASH_OP(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
    return _blind_rows_zero(out, lse, mask)


def lse_rows(lse: torch.Tensor, queries: int) -> torch.Tensor:
    """The efficient kernel's LSE `[B, H, ceil(S_q / 32) * 32]` cut to its `S_q` real rows."""
    return lse.narrow(-1, 0, queries)


def additive_bias(mask: torch.Tensor, dtype: torch.dtype, heads: int, queries: int) -> torch.Tensor:
    """A `[B, S_k]` key mask as an additive bias `[B, heads, queries, S_k]` (an expanded view, no copy per head or
    query) in `dtype`; its rows sit in storage padded to `BIAS_ALIGN` elements, as the efficient kernel needs."""
    b, keys = mask.shape
    padded = -(-keys // BIAS_ALIGN) * BIAS_ALIGN
    bias = torch.zeros(b, 1, 1, padded, dtype=dtype, device=mask.device).narrow(-1, 0, keys)
    if mask.dtype == torch.bool:
        bias.masked_fill_(torch.logical_not(mask).view(b, 1, 1, keys), float("-inf"))
    else:
        bias.copy_(mask.view(b, 1, 1, keys))
    return bias.expand(b, heads, queries, keys)


def key_visible(mask: torch.Tensor) -> torch.Tensor:
    """`[B]` bool: the batch row sees at least one key of the block (no host read)."""
    return mask.any(dim=-1) if mask.dtype == torch.bool else torch.isfinite(mask).any(dim=-1)


def _blind_rows_zero(out, lse, mask):
    """out `[B, H, S_q, D]` (or `[B, S_q, H, D]`: only the batch dim is read), lse `[B, H, S_q]`, with rows that see
    no key set to 0 and -inf (module docstring)."""
    if mask is None:
        return out, lse
    visible = key_visible(mask)
    b = visible.shape[0]
    lse = torch.where(visible.view(b, 1, 1), lse, float("-inf"))
    out = torch.where(visible.view(b, 1, 1, 1), out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out, lse


def reference_block(q, k, v, mask, scale: float):
    """Attention of `q` over one key block in portable fp32 math, on `[B, S, H, D]` tensors (the tests' reference)."""
    out, lse = _reference(_bhsd(q), _bhsd(k), _bhsd(v), mask, scale)
    return _bhsd(out), lse


def _reference(q, k, v, mask, scale: float):
    """`reference_block` on `[B, H, S, D]` (module docstring): k and v are upcast once per block; scores are
    materialised for at most `MAX_SCORES` elements at a time (query rows in chunks)."""
    kf, vf = k.float(), v.float()
    bias = None if mask is None else additive_bias(mask, torch.float32, 1, 1)
    b, h, s_q, _ = q.shape
    rows = max(1, MAX_SCORES // max(1, b * h * k.shape[2]))
    parts = [_reference_rows(q_rows.float(), kf, vf, bias, scale) for q_rows in q.split(rows, dim=2)]
    if len(parts) == 1:
        return parts[0]
    return torch.cat([o for o, _ in parts], dim=2), torch.cat([lse for _, lse in parts], dim=2)


def _reference_rows(qf, kf, vf, bias, scale: float):
    """qf `[B, H, rows, D]`, kf / vf `[B, H, S_k, D]` fp32 -> out `[B, H, rows, D_v]`, lse `[B, H, rows]`."""
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    probs = torch.exp(scores - row_max)
    denom = probs.sum(dim=-1, keepdim=True)
    lse = (row_max + denom.log()).squeeze(-1)
    out = torch.matmul(probs, vf) / denom.clamp_min(torch.finfo(torch.float32).tiny)
    return out, lse


def _bhsd(t: torch.Tensor) -> torch.Tensor:
    """`[B, S, H, D]` <-> `[B, H, S, D]` (a view)."""
    return t.transpose(1, 2)


FLASH = BlockKernel("flash", _flash)
EFFICIENT = BlockKernel("efficient", _efficient)
CUDNN = BlockKernel("cudnn", _cudnn)
CPU_FLASH_KERNEL = BlockKernel("cpu_flash", _cpu_flash)
REFERENCE = BlockKernel("reference", _reference)
