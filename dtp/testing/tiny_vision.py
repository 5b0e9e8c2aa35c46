"""Tiny random-weight vision-language models whose vision towers the bundled plans shard, and their images.

Each has a vision tower of 2 blocks, width 32, 4 heads of 8, (gated) MLP intermediate 64 and patch 2 (a
patch embedding of 768 weights, so the sharded blocks are most of the tower), a language model of
4 heads and 4 kv heads (the whole model splits over tp in {1, 2, 4}), and two images of different
sizes in one call:

- Qwen2.5-VL: block 0 window attention, block 1 full attention; merger 128 -> 128 -> 32. Images of
  4 x 8 and 6 x 4 patches: merged 2 x 4 and 3 x 2, cut by 2 x 2 windows into 2 + 2 windows (the
  last one partial).
- Mistral 3 (Pixtral tower): images of 4 x 6 and 6 x 4 patches, padded into one 12 x 12 batch and
  cropped back by `image_sizes`; the projector (RMS norm, 2 x 2 patch merger 128 -> 32, then
  linear_1 32 -> 32, GELU, linear_2 32 -> 32) runs through `get_image_features`.
- Gemma 3 (SigLIP tower, no pooling head): two 8 x 8 images (4 x 4 patches), the projector pooling 2 x 2 into
  4 tokens and projecting 32 -> 32 with its bare weight, through `get_image_features`.
- Qwen3-VL: Qwen2.5-VL's two images; a 4 x 4 position table interpolated to each grid; block 0's output through
  a DeepStack merger, block 1's through the merger (128 -> 128 -> 32).
"""

from __future__ import annotations

import torch

from ..runtime.memory import local_param_bytes
from .perturb import perturb

WIDTH, HEADS, PATCH, CHANNELS = 32, 4, 2, 3
QWEN_VL, MISTRAL3 = "Qwen2_5_VLForConditionalGeneration", "Mistral3ForConditionalGeneration"
GEMMA3, QWEN3_VL = "Gemma3ForConditionalGeneration", "Qwen3VLForConditionalGeneration"
_TEXT = dict(
    vocab_size=64,
    hidden_size=WIDTH,
    intermediate_size=2 * WIDTH,
    num_hidden_layers=1,
    num_attention_heads=HEADS,
    num_key_value_heads=HEADS,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# Qwen2.5-VL: (t, h, w) in patches per image; h and w are multiples of the spatial merge size 2.
QWEN_VL_GRID_THW = ((1, 4, 8), (1, 6, 4))
QWEN_VL_TEMPORAL_PATCH = 2
# Mistral 3: (height, width) in pixels per image, multiples of patch x spatial merge size = 4.
MISTRAL3_IMAGE_SIZES = ((8, 12), (12, 8))
GEMMA3_IMAGE_SIDE = 8  # SigLIP's fixed square input: 4 x 4 patches, pooled 2 x 2 into mm_tokens_per_image = 4


def _qwen2_5_vl_config(vision: dict | None = None):
    """The tiny config; `vision` replaces the tiny vision tower's config (a full-size one, on meta)."""
    import transformers as tf

    half = WIDTH // HEADS // 2  # text rotary frequencies per head, split over (t, h, w)
    text = dict(_TEXT, rope_scaling={"type": "mrope", "mrope_section": [1, 1, half - 2]})
    vision = vision or dict(
        depth=2,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_heads=HEADS,
        out_hidden_size=WIDTH,
        patch_size=PATCH,
        temporal_patch_size=QWEN_VL_TEMPORAL_PATCH,
        in_channels=CHANNELS,
        spatial_merge_size=2,
        window_size=2 * 2 * PATCH,  # 2 x 2 merged patches per window
        fullatt_block_indexes=[1],
    )
    return tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision)


def _mistral3_config(vision: dict | None = None):
    """The tiny config; `vision` replaces the tiny Pixtral tower's config (a full-size one, on meta)."""
    import transformers as tf

    vision = vision or dict(
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        head_dim=WIDTH // HEADS,
        num_channels=CHANNELS,
        patch_size=PATCH,
        image_size=16,
    )
    text = dict(_TEXT, model_type="mistral", head_dim=WIDTH // HEADS)
    return tf.Mistral3Config(text_config=text, vision_config=vision, spatial_merge_size=2, image_token_index=3)


def _gemma3_config(vision: dict | None = None):
    """The tiny config; `vision` replaces the tiny SigLIP tower's config (a full-size one, on meta)."""
    import transformers as tf

    vision = vision or dict(
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_channels=CHANNELS,
        patch_size=PATCH,
        image_size=GEMMA3_IMAGE_SIDE,
        vision_use_head=False,  # gemma-3-12b's tower has no pooling head
    )
    text = dict(_TEXT, head_dim=WIDTH // HEADS)
    tokens = 4 if vision.get("image_size") == GEMMA3_IMAGE_SIDE else 256
    return tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=tokens)


def _qwen3_vl_config(vision: dict | None = None):
    """The tiny config; `vision` replaces the tiny vision tower's config (a full-size one, on meta)."""
    import transformers as tf

    half = WIDTH // HEADS // 2  # text rotary frequencies per head, split over (t, h, w)
    text = dict(_TEXT, head_dim=WIDTH // HEADS, rope_parameters={"mrope_section": [1, 1, half - 2]})
    vision = vision or dict(
        depth=2,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_heads=HEADS,
        out_hidden_size=WIDTH,
        patch_size=PATCH,
        temporal_patch_size=QWEN_VL_TEMPORAL_PATCH,
        in_channels=CHANNELS,
        spatial_merge_size=2,
        num_position_embeddings=16,  # a 4 x 4 table, bilinearly interpolated to each image's grid
        deepstack_visual_indexes=[0],  # block 0's output through a DeepStack merger, block 1's through the merger
    )
    return tf.Qwen3VLConfig(text_config=text, vision_config=vision)


VISION_CLASSES = {
    QWEN_VL: _qwen2_5_vl_config,
    MISTRAL3: _mistral3_config,
    GEMMA3: _gemma3_config,
    QWEN3_VL: _qwen3_vl_config,
}


def tiny_vision_model(class_name: str, seed: int = 0, **vision) -> torch.nn.Module:
    """The tiny `class_name` with weights drawn from `seed` (every parameter perturbed), in eval mode, eager
    attention, fp32; `vision` overrides entries of the tiny vision config (e.g. widths tp does not divide, for
    pad=True)."""
    import transformers as tf

    config = VISION_CLASSES[class_name]()
    for key, value in vision.items():
        setattr(config.vision_config, key, value)
    for sub in (config, config.vision_config, config.text_config):
        sub._attn_implementation = "eager"
    torch.manual_seed(seed)
    return perturb(getattr(tf, class_name)(config), seed).eval()


def meta_vision_model(class_name: str, vision: dict, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """`class_name` with the tiny language model and the vision tower `vision` (e.g. a released one's
    vision_config) on the meta device: the per-rank bytes of a full-size vision tower, without memory."""
    import transformers as tf

    with torch.device("meta"):
        model = getattr(tf, class_name)(VISION_CLASSES[class_name](vision))
    return model.to(dtype).eval()


def tiny_vision_inputs(class_name: str, seed: int = 0) -> dict:
    """Two images for `class_name`'s vision tower.

    Qwen2.5-VL and Qwen3-VL: `pixel_values` [patches, 3 * 2 * 2 * 2] and `grid_thw` [2, 3]. Gemma 3:
    `pixel_values` [2, 3, 8, 8]. Mistral 3:
    `pixel_values` [2, 3, 12, 12] (each image in its top-left corner) and `image_sizes` [2, 2].
    """
    generator = torch.Generator().manual_seed(seed)
    if class_name == GEMMA3:
        side = GEMMA3_IMAGE_SIDE
        return dict(pixel_values=torch.randn(2, CHANNELS, side, side, generator=generator))
    if class_name in (QWEN_VL, QWEN3_VL):
        grid_thw = torch.tensor(QWEN_VL_GRID_THW)
        patches = int(grid_thw.prod(-1).sum())
        features = CHANNELS * QWEN_VL_TEMPORAL_PATCH * PATCH * PATCH
        return dict(pixel_values=torch.randn(patches, features, generator=generator), grid_thw=grid_thw)
    side = max(max(size) for size in MISTRAL3_IMAGE_SIZES)
    pixel_values = torch.randn(len(MISTRAL3_IMAGE_SIZES), CHANNELS, side, side, generator=generator)
    return dict(pixel_values=pixel_values, image_sizes=torch.tensor(MISTRAL3_IMAGE_SIZES))


def vision_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """What runs on images: Qwen2.5-VL's `visual` (its merger included), Mistral 3's tower and projector."""
    if type(model).__name__ in (QWEN_VL, QWEN3_VL):
        return [model.model.visual]
    return [model.model.vision_tower, model.model.multi_modal_projector]


def vision_bytes(model: torch.nn.Module) -> int:
    """This rank's parameter bytes of `vision_modules(model)`."""
    return sum(local_param_bytes(module) for module in vision_modules(model))


def vision_outputs(model: torch.nn.Module, inputs: dict) -> list[torch.Tensor]:
    """Every vision block's output and the image features the language model would receive."""
    name = type(model).__name__
    if name == QWEN_VL:
        out = model.model.visual(inputs["pixel_values"], grid_thw=inputs["grid_thw"], output_hidden_states=True)
        return [*out.hidden_states, out.last_hidden_state, out.pooler_output]
    if name == QWEN3_VL:  # block 0 through its DeepStack merger, block 1 whole and merged
        out = model.model.visual(inputs["pixel_values"], grid_thw=inputs["grid_thw"])
        return [*out.deepstack_features, out.last_hidden_state, out.pooler_output]
    if name == GEMMA3:
        out = model.model.get_image_features(inputs["pixel_values"], output_hidden_states=True)
        return [*out.hidden_states, out.last_hidden_state, out.pooler_output]
    out = model.model.get_image_features(
        inputs["pixel_values"], inputs["image_sizes"], vision_feature_layer=-1, output_hidden_states=True
    )
    return [*out.hidden_states, out.last_hidden_state, *out.pooler_output]
