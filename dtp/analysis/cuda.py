"""A forward on fake CUDA tensors on a CPU-only torch: what would run on the GPU, without one.

Under `FakeTensorMode`, `device="cuda"` tensors exist on this CPU build and most aten ops run on them, torch's
fused CUDA attention ops included (`aten._scaled_dot_product_flash_attention`, `_efficient_attention`,
`_cudnn_attention`: they return the output and the log-sum-exp shapes). Three things stand in the way, and
`CudaRoute` (a `TorchFunctionMode` entered around the forward) handles each:

    x[key], x[key] = v   `Tensor.__getitem__` / `__setitem__` raise "not linked with support for cuda devices"
                         (their C++ takes a device guard): done with their aten forms instead, as torch's own
                         indexing does (`applySlicing`: None -> unsqueeze, int -> select, slice -> slice, Ellipsis
                         skips dims, then one `aten.index` / `index_put_` over the remaining tensor indices)
    ~x, and a few more   the other Tensor methods whose C++ takes a device guard (found by calling each common one
                         on a fake CUDA tensor): `~` -> `torch.bitwise_not`; `contiguous()` of a strided view ->
                         `aten.clone`; `to(device)`, `cuda()` -> `aten._to_copy`; `copy_` -> `aten.copy_`;
                         `new_tensor` -> `torch.tensor` on the same device
    F.scaled_dot_product_attention
                         its kernel choice (`_fused_sdp_choice`) has no CUDA implementation on a CPU build, so it
                         falls back to the math decomposition; here the kernel a CUDA build of torch would pick is
                         called instead (`sdpa_kernel_choice`, the rules of torch's `sdp_utils.cpp` on sm80-sm90:
                         the enabled backends in `torch._C._get_sdp_priority_order()` order, flash / efficient /
                         math / cudnn by default, each taken when its input checks pass)

Ops that call a fused attention kernel themselves (dtp's ring block, diffusers' `forward_op(return_lse=True)`)
need nothing: the trace sees the aten op they call. Parameters must not require grad (a fake CUDA leaf that does
aborts the process in autograd's `InputMetadata`); `trace.to_fake` clears it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode

FLASH_MAX_HEAD_DIM = 256  # FlashAttention-2 in torch: q, k, v head dims equal and at most 256
CUDNN_MAX_HEAD_DIM = 128  # cuDNN's fused flash attention (torch's check for sm80-sm90)
LOW_PRECISION = (torch.float16, torch.bfloat16)
SDPA_OPS = {
    SDPBackend.FLASH_ATTENTION: "aten._scaled_dot_product_flash_attention",
    SDPBackend.EFFICIENT_ATTENTION: "aten._scaled_dot_product_efficient_attention",
    SDPBackend.CUDNN_ATTENTION: "aten._scaled_dot_product_cudnn_attention",
    SDPBackend.MATH: "math (aten.bmm + softmax)",
}
_ENABLED = {
    SDPBackend.FLASH_ATTENTION: torch._C._get_flash_sdp_enabled,
    SDPBackend.EFFICIENT_ATTENTION: torch._C._get_mem_efficient_sdp_enabled,
    SDPBackend.CUDNN_ATTENTION: torch._C._get_cudnn_sdp_enabled,
    SDPBackend.MATH: torch._C._get_math_sdp_enabled,
}


def sdpa_kernel_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False):
    """The `SDPBackend` torch's CUDA `F.scaled_dot_product_attention` runs for these inputs on an sm80-sm90 GPU
    (A100, H100, H200), honouring `torch.nn.attention.sdpa_kernel` and the priority order; None when no enabled
    backend accepts them (torch raises "No available kernel" there).

    e.g. bf16 [1, 24, 4096, 128] q, k, v without a mask: FLASH_ATTENTION; with a mask: EFFICIENT_ATTENTION (flash
    takes none); fp32: EFFICIENT_ATTENTION (flash takes 16-bit only); head dim 72 in fp16 with a mask: MATH.
    """
    order = [SDPBackend(int(b)) for b in torch._C._get_sdp_priority_order() if int(b) in (0, 1, 2, 3)]
    for backend in order:
        if _ENABLED[backend]() and _accepts(backend, query, key, value, attn_mask, enable_gqa):
            return backend
    return None


def _accepts(backend, q, k, v, mask, enable_gqa) -> bool:
    """Input checks of one backend (torch's `use_flash_attention` / `use_mem_efficient_attention` /
    `use_cudnn_attention`, dense tensors, inference)."""
    if backend == SDPBackend.MATH:
        return True
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    same_heads = q.shape[1] == k.shape[1] == v.shape[1]
    gqa = enable_gqa and k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0
    head_dim = q.shape[-1]
    if backend == SDPBackend.FLASH_ATTENTION:
        dims_ok = head_dim == k.shape[-1] == v.shape[-1] and head_dim <= FLASH_MAX_HEAD_DIM
        return mask is None and q.dtype in LOW_PRECISION and dims_ok and (same_heads or gqa)
    if backend == SDPBackend.EFFICIENT_ATTENTION:
        align = 8 if q.dtype in LOW_PRECISION else 4
        dims_ok = head_dim == k.shape[-1] and head_dim % align == 0 and v.shape[-1] % align == 0
        return q.dtype in (*LOW_PRECISION, torch.float32) and dims_ok and same_heads
    dims_ok = head_dim == k.shape[-1] == v.shape[-1] and head_dim <= CUDNN_MAX_HEAD_DIM and head_dim % 8 == 0
    return q.dtype in LOW_PRECISION and dims_ok and same_heads


def _bias(mask, query):
    """A boolean mask as the additive bias the fused kernels take (torch's `convert_boolean_attn_mask`)."""
    if mask is None or mask.dtype is not torch.bool:
        return mask
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(mask, zero, torch.full((), -math.inf, dtype=query.dtype, device=query.device))


def fused_sdpa(backend, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """The output of `backend`'s aten op on these inputs (what CUDA's SDPA returns), its LSE computed and dropped."""
    aten = torch.ops.aten
    if backend == SDPBackend.FLASH_ATTENTION:
        if key.shape[1] != query.shape[1]:  # GQA: FlashAttention-2 reads the shared k / v heads in place
            group = query.shape[1] // key.shape[1]
            key, value = (t.repeat_interleave(group, dim=1) for t in (key, value))
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    bias = _bias(attn_mask, query)
    if backend == SDPBackend.EFFICIENT_ATTENTION:
        op = aten._scaled_dot_product_efficient_attention
        return op(query, key, value, bias, False, dropout_p, is_causal, scale=scale)[0]
    op = aten._scaled_dot_product_cudnn_attention
    return op(query, key, value, bias, False, dropout_p, is_causal, False, scale=scale)[0]


class CudaRoute(TorchFunctionMode):
    """`with CudaRoute(): model(**fake_cuda_inputs)`: indexing and `~` through their aten forms, and SDPA through the
    kernel a CUDA build would pick (module docstring). Tensors on other devices take torch's own path."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__ and _on_cuda(args[0]):
            return index(args[0], args[1])
        if func is torch.Tensor.__setitem__ and _on_cuda(args[0]):
            return index_put(args[0], args[1], args[2])
        if func in _GUARDED and _on_cuda(args[0]):
            return _GUARDED[func](*args, **kwargs)
        if func is torch.Tensor.to and (_on_cuda(args[0]) or _to_cuda(args, kwargs)):
            return _to(*args, **kwargs)
        if func is torch.Tensor.cuda:
            return _to(args[0], "cuda")
        if func is F.scaled_dot_product_attention and _on_cuda(args[0] if args else kwargs.get("query")):
            return _sdpa(*args, **kwargs)
        return func(*args, **kwargs)


def _contiguous(tensor, memory_format=torch.contiguous_format):
    if tensor.is_contiguous(memory_format=memory_format):
        return tensor
    return torch.ops.aten.clone(tensor, memory_format=memory_format)


def _to_cuda(args, kwargs) -> bool:
    device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
    return device is not None and device.type == "cuda"


def _to(tensor, *args, **kwargs):
    """`tensor.to(...)` with a device in it: `aten._to_copy` (or the tensor itself when nothing changes)."""
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    device, dtype = device or tensor.device, dtype or tensor.dtype
    if device == tensor.device and dtype == tensor.dtype and not kwargs.get("copy", False):
        return tensor
    return torch.ops.aten._to_copy(tensor, dtype=dtype, device=device, non_blocking=non_blocking)


_GUARDED = {
    torch.Tensor.__invert__: torch.bitwise_not,
    torch.Tensor.contiguous: _contiguous,
    torch.Tensor.copy_: lambda t, src, non_blocking=False: torch.ops.aten.copy_(t, src, non_blocking),
    torch.Tensor.new_tensor: lambda t, data, dtype=None, **k: torch.tensor(data, dtype=dtype or t.dtype).to(t.device),
}


def _on_cuda(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda"


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    backend = sdpa_kernel_choice(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if backend is None:
        raise RuntimeError(
            f"scaled_dot_product_attention on CUDA: no enabled backend takes q {tuple(query.shape)} {query.dtype} "
            f"with{'out' if attn_mask is None else ''} a mask (torch: 'No available kernel')"
        )
    if backend == SDPBackend.MATH:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    return fused_sdpa(backend, query, key, value, attn_mask, dropout_p, is_causal, scale)


# ---------------------------------------------------------------------------------------------
# indexing in aten ops


def _basic(tensor, key):
    """(view after None / int / slice / Ellipsis, the tensor indices left, aligned to the view's dims)."""
    key = key if isinstance(key, tuple) else (key,)
    key = tuple(_as_index(k, tensor.device) for k in key)
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis and not _is_bool_index(k))
    consumed += sum(k.dim() for k in key if _is_bool_index(k))
    view, dim, advanced = tensor, 0, []
    for k in key:
        if k is Ellipsis:
            skip = tensor.dim() - consumed
            dim += skip
            advanced += [None] * skip
        elif k is None:
            view = torch.ops.aten.unsqueeze(view, dim)
            dim += 1
            advanced.append(None)
        elif isinstance(k, int):
            view = torch.ops.aten.select(view, dim, k)
        elif isinstance(k, slice):
            start, stop, step = k.start or 0, k.stop if k.stop is not None else 2**62, k.step or 1
            view = torch.ops.aten.slice(view, dim, start, stop, step)
            dim += 1
            advanced.append(None)
        elif _is_bool_index(k):  # a mask: its nonzero positions, one index per dim it covers (as torch does)
            dim += k.dim()
            advanced += list(torch.ops.aten.unbind(torch.ops.aten.nonzero(k), 1))
        else:  # a tensor index: kept for the one aten.index at the end
            dim += 1
            advanced.append(k)
    return view, advanced


def _is_bool_index(k) -> bool:
    return isinstance(k, torch.Tensor) and k.dtype is torch.bool


def _as_index(k, device):
    """A list / bool / SymInt key as what `_basic` walks: a tensor, an int, a slice, None or Ellipsis."""
    if isinstance(k, bool):
        return torch.tensor(k).to(device)
    if isinstance(k, (list, tuple)):
        return torch.tensor(k).to(device)
    if isinstance(k, torch.Tensor) and k.dim() == 0 and not k.is_floating_point() and k.dtype is not torch.bool:
        return k  # a 0-d integer tensor indexes like a 1-element one, with the dim dropped by aten.index
    return k.__index__() if hasattr(k, "__index__") and not isinstance(k, torch.Tensor) else k


def index(tensor, key):
    """`tensor[key]` in aten ops (module docstring)."""
    view, advanced = _basic(tensor, key)
    if not any(isinstance(k, torch.Tensor) for k in advanced):
        return view
    return torch.ops.aten.index.Tensor(view, _trim(advanced))


def index_put(tensor, key, value) -> None:
    """`tensor[key] = value` in aten ops: a copy into the view, or one `index_put_` over the tensor indices."""
    view, advanced = _basic(tensor, key)
    if not isinstance(value, torch.Tensor):
        value = torch.full((), value, dtype=tensor.dtype, device=tensor.device)
    if not any(isinstance(k, torch.Tensor) for k in advanced):
        torch.ops.aten.copy_(view, value)
        return
    torch.ops.aten.index_put_(view, _trim(advanced), value)


def _trim(indices: list) -> list:
    """aten.index's list: trailing Nones dropped (they index nothing)."""
    while indices and indices[-1] is None:
        indices.pop()
    return indices
