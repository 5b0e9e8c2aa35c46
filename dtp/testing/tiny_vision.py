"""Tiny random-weight vision-language models whose vision towers the bundled plans shard, and their images.

Qwen2.5-VL: a vision tower of depth 2 (block 0 window attention, block 1 full attention), width 32,
4 heads of 8, SwiGLU intermediate 64, patch 2 (a Conv3d of 768 weights, so the sharded blocks are
most of the tower) and a merger 128 -> 128 -> 32. The language model has 4 heads and 4 kv heads,
so the whole model splits over tp in {1, 2, 4}. Two images of 4 x 8 and 6 x 4 patches: merged
2 x 4 and 3 x 2, cut by 2 x 2 windows into 2 + 2 windows (the last one partial).
"""

from __future__ import annotations

import torch

WIDTH, HEADS = 32, 4
PATCH, TEMPORAL_PATCH, CHANNELS = 2, 2, 3
# (t, h, w) in patches per image; h and w are multiples of the spatial merge size 2.
GRID_THW = ((1, 4, 8), (1, 6, 4))


def _qwen2_5_vl_config(vision: dict | None = None):
    """The tiny config; `vision` replaces the tiny vision tower's config (a full-size one, on meta)."""
    import transformers as tf

    half = WIDTH // HEADS // 2  # text rotary frequencies per head, split over (t, h, w)
    text = dict(
        vocab_size=64,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=64,
        rope_scaling={"type": "mrope", "mrope_section": [1, 1, half - 2]},
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = vision or dict(
        depth=2,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_heads=HEADS,
        out_hidden_size=WIDTH,
        patch_size=PATCH,
        temporal_patch_size=TEMPORAL_PATCH,
        in_channels=CHANNELS,
        spatial_merge_size=2,
        window_size=2 * 2 * PATCH,  # 2 x 2 merged patches per window
        fullatt_block_indexes=[1],
    )
    return tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision)


VISION_CLASSES = {"Qwen2_5_VLForConditionalGeneration": _qwen2_5_vl_config}


def tiny_vision_model(class_name: str, seed: int = 0) -> torch.nn.Module:
    """The tiny `class_name` with weights drawn from `seed`, in eval mode, eager attention, fp32."""
    import transformers as tf

    config = VISION_CLASSES[class_name]()
    config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return getattr(tf, class_name)(config).eval()


def meta_vision_model(class_name: str, vision: dict, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """`class_name` with the tiny language model and the vision tower `vision` (e.g. a released one's
    vision_config) on the meta device: the per-rank bytes of a full-size vision tower, without memory."""
    import transformers as tf

    with torch.device("meta"):
        model = getattr(tf, class_name)(VISION_CLASSES[class_name](vision))
    return model.to(dtype).eval()


def tiny_vision_inputs(seed: int = 0) -> dict:
    """`pixel_values` [patches, 3 * 2 * 2 * 2] for the `GRID_THW` images and their `grid_thw` [images, 3]."""
    grid_thw = torch.tensor(GRID_THW)
    patches = int(grid_thw.prod(-1).sum())
    generator = torch.Generator().manual_seed(seed)
    pixel_values = torch.randn(patches, CHANNELS * TEMPORAL_PATCH * PATCH * PATCH, generator=generator)
    return dict(pixel_values=pixel_values, grid_thw=grid_thw)


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision tower of a vision-language model."""
    return model.model.visual


def vision_outputs(model: torch.nn.Module, inputs: dict) -> list[torch.Tensor]:
    """Every block's output (window order) and the merged image features, as the tower returns them."""
    out = vision_tower(model)(inputs["pixel_values"], grid_thw=inputs["grid_thw"], output_hidden_states=True)
    return [*out.hidden_states, out.last_hidden_state, out.pooler_output]
