"""Tiny random-weight transformers text encoders, one per bundled text-encoder plan, and their inputs.

Every config has 4 query heads and, where the class has GQA, 2 kv heads (so tp=2 gives each rank 2
query heads over 1 kv head, and tp=4 shares each kv head between 2 ranks), a width of 32, 2 layers
and a vocabulary of 64 rows. `tiny_grouped_qwen` has Qwen2.5-VL-7B's head shape in small: query
heads in groups that tp does not divide (6 = 2 groups of 3; the 7B has 4 groups of 7). Inputs are
2 prompts of 8 tokens, the second right-padded by 3 (attention mask 0), as pipelines pad prompts to
a fixed length.
"""

from __future__ import annotations

import torch

from .perturb import perturb

WIDTH, HEADS, KV_HEADS, LAYERS, VOCAB = 32, 4, 2, 2, 64
_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=WIDTH,
    intermediate_size=2 * WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_T5 = dict(
    vocab_size=VOCAB,
    d_model=WIDTH,
    d_kv=WIDTH // HEADS,
    d_ff=2 * WIDTH,
    num_layers=LAYERS,
    num_heads=HEADS,
    relative_attention_num_buckets=8,
    feed_forward_proj="gated-gelu",
    pad_token_id=0,
    eos_token_id=1,
)


def _config(class_name: str):
    import transformers as tf

    if class_name in ("T5EncoderModel", "UMT5EncoderModel"):
        return (tf.T5Config if class_name == "T5EncoderModel" else tf.UMT5Config)(**_T5)
    if class_name in ("CLIPTextModel", "CLIPTextModelWithProjection"):
        return tf.CLIPTextConfig(
            vocab_size=VOCAB,
            hidden_size=WIDTH,
            intermediate_size=2 * WIDTH,
            projection_dim=16,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            max_position_embeddings=16,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    if class_name in ("LlamaModel", "LlamaForCausalLM"):
        return tf.LlamaConfig(**_DECODER)
    if class_name == "Qwen3Model":
        return tf.Qwen3Config(**_DECODER, head_dim=WIDTH // HEADS)
    if class_name == "Gemma2Model":
        return tf.Gemma2Config(**_DECODER, head_dim=WIDTH // HEADS, sliding_window=4)
    if class_name == "GlmModel":
        return tf.GlmConfig(**_DECODER, head_dim=WIDTH // HEADS)
    if class_name == "Qwen2_5_VLForConditionalGeneration":
        half = WIDTH // HEADS // 2  # rotary frequencies per head, split over (t, h, w)
        text = dict(_DECODER, rope_scaling={"type": "mrope", "mrope_section": [1, 1, half - 2]})
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=WIDTH)
        return tf.Qwen2_5_VLConfig(text_config=text, vision_config=dict(vision, fullatt_block_indexes=[0]))
    if class_name == "Qwen2_5_VLTextModel":
        half = WIDTH // HEADS // 2  # rotary frequencies per head, split over (t, h, w)
        return tf.Qwen2_5_VLTextConfig(**_DECODER, rope_scaling={"type": "mrope", "mrope_section": [1, 1, half - 2]})
    if class_name == "Mistral3ForConditionalGeneration":
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, head_dim=8)
        return tf.Mistral3Config(text_config=dict(_DECODER, model_type="mistral"), vision_config=vision)
    if class_name == "Gemma3ForConditionalGeneration":
        text = dict(
            _DECODER, head_dim=WIDTH // HEADS, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
        )
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=8)
        vision = dict(vision, patch_size=2, vision_use_head=False)  # gemma-3-12b: no pooling head
        return tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    if class_name == "Qwen3VLForConditionalGeneration":
        half = WIDTH // HEADS // 2  # rotary frequencies per head, split over (t, h, w)
        text = dict(_DECODER, head_dim=WIDTH // HEADS, rope_parameters={"mrope_section": [1, 1, half - 2]})
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=WIDTH)
        return tf.Qwen3VLConfig(text_config=text, vision_config=dict(vision, deepstack_visual_indexes=[0]))
    raise KeyError(f"no tiny text encoder config for {class_name}")


TEXT_CLASSES = (
    "T5EncoderModel",
    "UMT5EncoderModel",
    "CLIPTextModel",
    "CLIPTextModelWithProjection",
    "LlamaModel",
    "LlamaForCausalLM",
    "Qwen3Model",
    "Gemma2Model",
    "GlmModel",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2_5_VLTextModel",
    "Mistral3ForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
)


def tiny_text_model(class_name: str, seed: int = 0, **text) -> torch.nn.Module:
    """The tiny `class_name` with weights drawn from `seed` (every parameter perturbed), in eval mode, eager
    attention; `text` overrides entries of the (language model's) config, e.g. a released model's head counts."""
    import transformers as tf

    config = _config(class_name)
    for key, value in text.items():
        setattr(getattr(config, "text_config", config), key, value)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return perturb(getattr(tf, class_name)(config), seed).eval()


def tiny_grouped_qwen(seed: int = 0, heads: int = 6, kv_heads: int = 2, intermediate: int = 96) -> torch.nn.Module:
    """Qwen2.5-VL with `heads` query heads over `kv_heads` kv heads of width 8, fewer kv heads than ranks.

    Default 6 / 2 (hidden 48): at tp=4 each kv head is shared by 2 ranks and each group of 3 query
    heads pads to 4 (pad=True). `heads=28, kv_heads=4` is the 7B's head shape (hidden 224): at tp=8
    each group of 7 pads to 8, each kv head is shared by 2 ranks (`intermediate=150` pads to 152).
    """
    import transformers as tf

    text = dict(
        _DECODER,
        hidden_size=8 * heads,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
    )
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=8 * heads)
    config = tf.Qwen2_5_VLConfig(text_config=text, vision_config=dict(vision, fullatt_block_indexes=[0]))
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return perturb(tf.Qwen2_5_VLForConditionalGeneration(config), seed).eval()


def tiny_text_inputs(seed: int = 0) -> dict:
    """2 prompts x 8 token ids (never the pad id 0), the second right-padded by 3."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (2, 8), generator=generator)
    attention_mask = torch.ones(2, 8, dtype=torch.long)
    attention_mask[1, 5:] = 0
    input_ids[1, 5:] = 0
    return dict(input_ids=input_ids, attention_mask=attention_mask)


def hidden_states(model, inputs: dict) -> list[torch.Tensor]:
    """Every hidden state the model returns (embeddings, each layer, the last), and its logits if any."""
    out = model(**inputs, output_hidden_states=True)
    states = list(out.hidden_states) + [out.last_hidden_state] if hasattr(out, "last_hidden_state") else []
    states = states or list(out.hidden_states)
    if getattr(out, "logits", None) is not None:
        states.append(out.logits)
    return states
