"""Full-size checks of the video families (issue 45): what made FramePack's, JoyImage Edit's and Kandinsky 5's
`dtp check --cp 8` fail, each on a cheap stand-in (`analysis/bounds.py`, `analysis/inputs.py`, `hooks_alike`)."""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException

from dtp.analysis.forward import hooks_alike
from dtp.analysis.inputs import ForwardShape, forward_inputs
from dtp.analysis.trace import fake_like, fake_mode, to_fake, trace_call


class MaskSliced(nn.Module):
    """FramePack at batch 1: the prompt cut to `mask.sum(dim=1)[0]` tokens (a host read of a mask's count)."""

    def forward(self, text, **given):
        (mask,) = given.values()  # encoder_attention_mask, or the negative control's input of another name
        mask = torch.cat([mask.new_ones((1, 4)), mask], dim=1)
        count = mask.sum(dim=1, dtype=torch.int)
        return torch.cat([text, text], dim=1)[:, : count[0]] * 2


def _trace(inputs):
    with fake_mode():
        model = to_fake(MaskSliced().to("meta"))
        return trace_call(model, lambda m, **k: m(**k), {k: fake_like(v) for k, v in inputs.items()})


def test_a_mask_count_read_on_the_host_is_every_element_set():
    """The count of an int64 mask input (4 ones prepended) is read as its bound, 4 + 60: the slice keeps 64 of 120
    rows, and the read is counted as guessed. An integer input not named a mask has no bound: still refused."""
    text = torch.empty(1, 60, 8, device="meta")
    trace = _trace({"text": text, "encoder_attention_mask": torch.empty(1, 60, dtype=torch.long, device="meta")})
    assert trace.guessed_branches == 1
    assert trace.output_bytes == 64 * 8 * 4  # fp32 rows of the slice: the bound, not the 120 of the cat
    with pytest.raises(DataDependentOutputException):
        _trace({"text": text, "token_ids": torch.empty(1, 60, dtype=torch.long, device="meta")})


def test_hooks_on_a_later_block_keep_the_model_whole():
    """A gather hook on the last block (Kandinsky 5's `visual_transformer_blocks.-1`) would be cut away with it."""
    model = nn.Module()
    model.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    model.blocks[0].register_forward_pre_hook(lambda m, a: None)  # a split at the first block: kept by the cut
    assert hooks_alike(model)
    model.blocks[2].register_forward_hook(lambda m, a, o: None)
    assert not hooks_alike(model)


def test_joyimage_edit_full_size_inputs_keep_the_items_axis():
    """[B, N, C, T, H, W]: the target and a reference at 1024^2, 2 x 4096 tokens (the 5-D rewrite took N for C)."""
    config = {"in_channels": 16, "text_dim": 4096, "patch_size": [1, 2, 2]}
    inputs = forward_inputs("JoyImageEditTransformer3DModel", config, torch.bfloat16, ForwardShape())
    assert tuple(inputs.kwargs["hidden_states"].shape) == (1, 2, 16, 1, 128, 128)
    assert inputs.tokens == 8192


def test_framepack_full_size_histories_follow_the_grid():
    """The clean / 2x / 4x histories on the full-size latent grid, their frame indices before the noisy frames'."""
    config = {"in_channels": 16, "patch_size": 2, "text_embed_dim": 4096, "pooled_projection_dim": 768}
    config["image_proj_dim"] = 1152
    kwargs = forward_inputs("HunyuanVideoFramepackTransformer3DModel", config, torch.bfloat16, ForwardShape()).kwargs
    assert tuple(kwargs["latents_history_4x"].shape) == (1, 16, 4, 90, 160)
    assert kwargs["indices_latents"].tolist() == list(range(7, 7 + 33))
