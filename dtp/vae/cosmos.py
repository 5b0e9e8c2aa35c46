"""AutoencoderKLCosmos (Cosmos 1's tokenizer VAE) on row strips: (B, C, T, H, W) activations, the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_cosmos.py`) and why each is exact on strips:
- CosmosCausalConv3d (an nn.Conv3d with padding 0): the first frame repeated before the clip (time is not split),
  then F.pad of H and W by `spatial_pad` in `pad_mode` (zeros in every released config), then the conv. On a strip:
  halo rows from the neighbours, padding only at the image's top / bottom (`conv.rows_for_conv`). A 1 x 1 kernel in H
  without padding (to_q / to_k / to_v / to_out, the shortcuts, the temporal (3, 1, 1) convs) is row-local as is.
- CosmosDownsample3d: F.pad (0, 1, 0, 1) zeros, then a stride-2 (1, 3, 3) conv plus a 2 x 2 average pool, then the
  temporal conv and pool. On a strip the padded bottom row is the image's only on the last rank: the conv drops it and
  reads its real rows from the neighbour below (row padding (0, 1) over the whole image). The pool reads rows
  [2i, 2i + 1] of the padded strip: every strip has an even height (its bounds are multiples of the encoder's
  factor), so it never reads the padded row and is row-local; the temporal parts are row-local.
- CosmosPatchEmbed3d (the encoder's input): the Haar wavelet, log2(p) levels of 2-tap filters with stride 2 along T, H
  and W (after a reflect pad of one row at the bottom that a stride-2 pass over an even height never reads), or the
  plain p x p x p rearrangement: output row i reads input rows [2i, 2i + 1] (p i .. p i + p - 1): row-local when every
  strip bound is a multiple of p, which `height_stride` = p makes it (the encoder splits its input in multiples of the
  product). CosmosUnpatcher3d (the decoder's output): transposed 2-tap convs with stride 2: input row i writes output
  rows [2i, 2i + 1] only, row-local.
- CosmosCausalGroupNorm: a container; its nn.GroupNorm (per frame when num_groups == 1, the frames folded into the
  batch; else over the clip) takes the generic rule: the whole image's statistics.
- CosmosCausalAttention: the spatial processor attends over the H x W positions of each frame: local queries, the K
  and V convs' outputs gathered along the rows one frame at a time (`spatial_attention_rows`; rank order = row-major
  order); the temporal processor attends over the frames of each pixel (one sequence per position): row-local.
- CosmosUpsample3d: nearest x2 in H and W by repeat_interleave (row-local), then its convs.
Refused (PlanError naming the layer): circular padding, another attention processor, a patch method other than haar /
rearrange.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .conv import rows_for_conv
from .halo import gather_rows
from .split import Split
from .strip_rule import StripRule, VaeParallel, named_rule

EDGES = {"constant": "zeros", "replicate": "replicate", "reflect": "reflect"}  # F.pad mode -> strip edge
PROCESSORS = {"CosmosSpatialAttentionProcessor2_0": "spatial", "CosmosTemporalAttentionProcessor2_0": "temporal"}


def conv_rows(module: nn.Conv3d, x: torch.Tensor, split: Split, row_pad: tuple[int, int] | None = None) -> torch.Tensor:
    """CosmosCausalConv3d.forward on a (B, C, T, h, W) strip: this rank's output rows.

    row_pad: the untiled conv's (top, bottom) row padding when it is not its own `spatial_pad` (the downsampler's
    (0, 1): diffusers pads it before the conv, which pads nothing)."""
    x = torch.cat([x[:, :, :1].repeat(1, 1, module.temporal_pad, 1, 1), x], dim=2)
    w_left, w_right, h_top, h_bottom = module.spatial_pad
    pads = row_pad or (h_top, h_bottom)
    geometry = dict(kernel=module.kernel_size[1], stride=module.stride[1], dilation=module.dilation[1])
    x = rows_for_conv(x, 3, split, **geometry, pads=pads, edge=EDGES[module.pad_mode])
    if w_left or w_right:
        x = F.pad(x, (w_left, w_right, 0, 0, 0, 0), mode=module.pad_mode)
    return F.conv3d(x, module.weight, module.bias, module.stride, 0, module.dilation, module.groups)


def row_local(module: nn.Conv3d) -> bool:
    """A 1-row kernel with stride 1 and no row padding: each output row reads its own input row only."""
    return module.kernel_size[1] == 1 and module.stride[1] == 1 and not any(module.spatial_pad[2:])


def check_conv(module: nn.Conv3d) -> str | None:
    if module.pad_mode not in EDGES:
        return f"pad_mode={module.pad_mode!r} (split: {', '.join(EDGES)})"
    return None


def _install_conv(module: nn.Conv3d, state: VaeParallel) -> None:
    if not row_local(module):
        state.replace(module, lambda x: conv_rows(module, x, state.split))


def check_downsample(module: nn.Module) -> str | None:
    """Why a CosmosDownsample3d has no strip rule: its temporal convs and conv3 must be row-local."""
    for name in ("conv2", "conv3"):
        conv = getattr(module, name)
        if isinstance(conv, nn.Conv3d) and not row_local(conv):
            return f"a {name} with kernel {conv.kernel_size}, stride {conv.stride}, padding {conv.spatial_pad}"
    if module.spatial_downsample and any(module.conv1.spatial_pad):
        return f"a stride-2 conv1 padded {module.conv1.spatial_pad} after diffusers' (0, 1) pad (only 0)"
    return None


def _install_downsample(module: nn.Module, state: VaeParallel) -> None:
    if not module.spatial_downsample:
        return
    conv = module.conv1

    def strip_conv(x):
        # x: the strip diffusers padded (0, 1) in H and W; its last row is zeros, the image's bottom only on the last
        # rank: dropped, and the (0, 1) row padding taken over the whole image instead.
        return conv_rows(conv, x.narrow(3, 0, x.shape[3] - 1), state.split, row_pad=(0, 1))

    state.replace(conv, strip_conv)


def check_attention(module: nn.Module) -> str | None:
    name = type(module.processor).__name__
    if name not in PROCESSORS:
        return f"processor {name} (split: {', '.join(PROCESSORS)})"
    return None


def spatial_attention_rows(attn: nn.Module, x: torch.Tensor, split: Split, attention_mask=None) -> torch.Tensor:
    """CosmosSpatialAttentionProcessor2_0 on a (B, C, T, h, W) strip: this rank's queries against every row's keys.

    The attention is per frame (diffusers folds the frames into the batch), so K and V are gathered one frame at a
    time: a rank holds the whole image's K and V of one frame, not of the clip (at Cosmos 1's 704 x 1280, 17 frames, the
    mid block's gathered K and V of the clip were 0.49 GB per rank, a 0.168x decode peak at N = 8)."""
    batch, channels, frames, height, width = x.shape
    residual = x
    hidden = attn.norm(x)
    query, key, value = attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden)
    counts = tuple(rows * width for rows in split.counts(height))
    heads = attn.num_attention_heads
    out = torch.empty_like(query)
    for frame in range(frames):
        # (B, C, h, W) -> (B, h W, C), K / V gathered along the tokens (rank order: row-major) -> (B, N, S, C / N)
        q, k, v = (t[:, :, frame].flatten(2).transpose(1, 2) for t in (query, key, value))
        k, v = (gather_rows(t.contiguous(), 1, counts, split.group) for t in (k, v))
        q, k, v = (t.unflatten(2, (heads, -1)).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        o = o.transpose(1, 2).flatten(2, 3).type_as(q)  # (B, h W, C)
        out[:, :, frame] = o.transpose(1, 2).unflatten(2, (height, width))
    out = attn.to_out[1](attn.to_out[0](out))
    return out + residual


def _install_attention(module: nn.Module, state: VaeParallel) -> None:
    if PROCESSORS[type(module.processor).__name__] != "spatial":
        return  # the temporal processor: one sequence of frames per position, row-local

    def forward(hidden_states, attention_mask=None):
        return spatial_attention_rows(module, hidden_states, state.split, attention_mask)

    state.replace(module, forward)


def check_patch(module: nn.Module) -> str | None:
    if module.patch_method not in ("haar", "rearrange"):
        return f"patch_method={module.patch_method!r} (split: haar, rearrange)"
    return None


RULES = (
    # conv1 run on strips here, conv2 / conv3 row-local; its height stride is conv1's, counted by the
    # CosmosCausalConv3d rule (`height_factor` reads every layer)
    named_rule("CosmosDownsample3d", check_downsample, install=_install_downsample, owns=lambda m: ("",)),
    named_rule("CosmosCausalConv3d", check_conv, install=_install_conv, height_stride=lambda m: m.stride[1]),
    named_rule("CosmosCausalAttention", check_attention, install=_install_attention),
    named_rule("CosmosPatchEmbed3d", check_patch, height_stride=lambda m: m.patch_size),
    named_rule("CosmosUnpatcher3d", check_patch),
    # a block without attention holds ModuleList([None])
    StripRule("empty ModuleList", lambda m: isinstance(m, nn.ModuleList) and not list(m.children())),
)
