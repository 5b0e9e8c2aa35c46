"""Float8 dynamic activation on a rowwise Linear: each token's scale from the WHOLE token.

torchao quantizes the activation per token (row) on the fly: `s_t = amax_k |x[t, k]| / 448`. A rowwise
layer's input is split by features, so rank r sees only x[t, K_r]; its local amax would give a
different (wrong) scale. Here the amax is all-reduced (max over tp) first, then each rank quantizes
its features with the whole token's scale and runs torchao's own float8 matmul on its piece:

    y = sum_r  (q(x_r / s) * s) (q(W_r) * w_s)^T + b      (s per token, w_s per output row, both whole)

which is the one-process result up to the order of the fp32 partial sums. With per-tensor activation
scales (torchao's default granularity) `s = amax_{t,k} |x[t, k]| / 448` is one number, all-reduced the
same way; a per-tensor weight scale is one number on every rank already. torch's DTensor rule for
`_scaled_mm` cannot express "data split along K, scales whole", so the forward runs on local tensors.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor

from .kinds import LAYOUT_ATTR


def needs_dynamic_rowwise(module: torch.nn.Module) -> bool:
    """A Linear whose sharded weight is float8 with dynamic activation quantization and split by columns."""
    weight = module.weight
    layout = getattr(weight, LAYOUT_ATTR, None)
    return (
        type(weight).__name__ == "Float8Tensor"
        and weight.act_quant_kwargs is not None
        and layout is not None
        and layout.dim == 1
        and isinstance(weight.qdata, DTensor)
    )


def install_dynamic_rowwise(module: torch.nn.Module) -> None:
    """Replace `module.forward` by `rowwise_float8_forward` when it needs it (see the module docstring)."""
    if needs_dynamic_rowwise(module):
        module.forward = lambda x: rowwise_float8_forward(module, x)


def rowwise_float8_forward(module: torch.nn.Module, x) -> torch.Tensor:
    """The rowwise float8-dynamic Linear on this rank's features; returns the all-reduced output (+ bias), a plain
    tensor (the rowwise style's output hook passes it through)."""
    from torchao.quantization.quant_primitives import _quantize_affine_float8
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor, _float8_addmm_impl

    weight = module.weight
    mesh, kwargs = weight.qdata.device_mesh, weight.act_quant_kwargs
    x = x.to_local() if isinstance(x, DTensor) else x
    per_tensor = type(kwargs.granularity).__name__ == "PerTensor"
    local_amax = x.abs().amax() if per_tensor else x.abs().amax(dim=-1, keepdim=True)
    amax = funcol.all_reduce(local_amax, "max", mesh.get_group())
    if kwargs.hp_value_lb is not None or kwargs.hp_value_ub is not None:
        amax = torch.clamp(amax, min=kwargs.hp_value_lb, max=kwargs.hp_value_ub)
    scale = (amax / torch.finfo(kwargs.float8_dtype).max).to(torch.float32)  # torchao's _choose_scale_float8
    block = list(x.shape) if per_tensor else [1] * (x.ndim - 1) + [x.shape[-1]]
    scale = scale.reshape([1] * x.ndim) if per_tensor else scale
    x8 = Float8Tensor(
        _quantize_affine_float8(x, scale, kwargs.float8_dtype),
        scale,
        block_size=block,
        mm_config=kwargs.mm_config,
        kernel_preference=kwargs.kernel_preference,
        dtype=x.dtype,
    )
    qdata, w_scale = weight.qdata.to_local(), weight.scale.to_local()
    local_weight = Float8Tensor(
        qdata,
        w_scale,
        block_size=[qdata.shape[0] if w_scale.numel() == 1 else 1, qdata.shape[1]],
        mm_config=weight.mm_config,
        kernel_preference=weight.kernel_preference,
        dtype=weight.dtype,
    )
    y = funcol.all_reduce(_float8_addmm_impl(x8, local_weight.t()), "sum", mesh.get_group())
    if module.bias is not None:
        bias = module.bias
        y = y + (bias.to_local() if isinstance(bias, DTensor) else bias)
    return y
