"""The released pipelines dtp knows by name: each public checkpoint's components and their configs, as data.

There is no model hub here, so the config.json values of each public checkpoint's components are written out
below; the transformers take their family's released config (`RELEASED` in the family module). `dtp check`,
`dtp fit` (and the run / serve commands they print) read this one registry; `analysis/released.py` builds the
components on the meta device. Parameter counts (checked by the unit tests):

    flux-pipeline       FLUX.1-dev      transformer 11.90 B, CLIP-L 123 M, T5-XXL 4.76 B, VAE 84 M
    flux2-pipeline      FLUX.2-dev      transformer 32.22 B, Mistral-Small-3.1 24B (23.34 B), VAE 84 M
    qwenimage-pipeline  Qwen-Image      transformer 20.43 B, Qwen2.5-VL-7B (8.29 B), VAE 127 M
    wan-pipeline        Wan2.1-T2V-14B  transformer 14 B, UMT5-XXL encoder 5.68 B, VAE
    wan-vace-pipeline   Wan2.1-VACE-14B transformer 17.34 B, UMT5-XXL encoder 5.68 B, VAE 127 M
    ltx2-pipeline       LTX-2           transformer 18.88 B, Gemma 3 12B (12.19 B), video VAE 1.22 B, text
                                        connectors 1.43 B, audio VAE 53 M, vocoder 56 M
    flux3-pipeline      FLUX.3          transformer 5.54 B, Qwen3-VL-4B (4.44 B), VAE 84 M
    hunyuanvideo15-pipeline  HunyuanVideo-1.5  transformer 8.33 B, Qwen2.5-VL-7B text (7.07 B), byT5 218 M, VAE 1.26 B
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# google/t5-v1_1-xxl (FLUX.1-dev text_encoder_2): 4.76 B parameters.
T5_XXL = dict(
    vocab_size=32128,
    d_model=4096,
    d_kv=64,
    d_ff=10240,
    num_layers=24,
    num_heads=64,
    relative_attention_num_buckets=32,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
)
# google/umt5-xxl encoder (Wan 2.1 text_encoder): 5.68 B parameters.
UMT5_XXL = {**T5_XXL, "vocab_size": 256384}  # T5 v1.1 XXL's shape with UMT5's vocabulary
# openai/clip-vit-large-patch14 text model (FLUX.1-dev text_encoder): 123 M parameters.
CLIP_L = dict(
    vocab_size=49408,
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    max_position_embeddings=77,
    projection_dim=768,
    hidden_act="quick_gelu",
)
# FLUX.1-dev vae (AutoencoderKL, 16 latent channels): 84 M parameters.
FLUX_VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[128, 256, 512, 512],
    layers_per_block=2,
    latent_channels=16,
    use_quant_conv=False,
    use_post_quant_conv=False,
)
# google/byt5-small's encoder (HunyuanVideo 1.5's glyph text_encoder_2; its byte vocabulary of 384).
BYT5_SMALL = dict(
    vocab_size=384,
    d_model=1472,
    d_kv=64,
    d_ff=3584,
    num_layers=12,
    num_heads=6,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
)
# Qwen/Qwen2.5-VL-7B-Instruct (Qwen-Image text_encoder): 28 heads, 4 kv heads.
QWEN25_VL_7B = dict(
    text_config=dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
        tie_word_embeddings=False,
    ),
    vision_config=dict(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=3584,
        fullatt_block_indexes=[7, 15, 23, 31],
    ),
    tie_word_embeddings=False,
)
# mistralai/Mistral-Small-3.1-24B-Instruct-2503 (FLUX.2-dev text_encoder): 32 heads, 8 kv heads.
MISTRAL_SMALL_31 = dict(
    text_config=dict(
        model_type="mistral",
        vocab_size=131072,
        hidden_size=5120,
        intermediate_size=32768,
        num_hidden_layers=40,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    ),
    vision_config=dict(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        head_dim=64,
        image_size=1540,
        patch_size=14,
    ),
    spatial_merge_size=2,
)

# google/gemma-3-12b-it (LTX-2 text_encoder, Gemma3ForConditionalGeneration): 48 layers, width 3840 (LTX-2's
# caption_channels), 16 heads of 256 over 8 kv heads (MaxText's gemma3-12b config); GeGLU 15360, the 262208-row
# vocabulary, window 1024 and the SigLIP-So400m tower at 896 px (27 layers, width 1152, MLP 4304, no pooling head) are
# the model card's config.json values as written here from memory of it, not read from a file (no hub here).
GEMMA3_12B = dict(
    text_config=dict(
        vocab_size=262208,
        hidden_size=3840,
        intermediate_size=15360,
        num_hidden_layers=48,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=1024,
    ),
    vision_config=dict(
        hidden_size=1152,
        intermediate_size=4304,
        num_hidden_layers=27,
        num_attention_heads=16,
        image_size=896,
        patch_size=14,
        vision_use_head=False,
    ),
    mm_tokens_per_image=256,
)
# Qwen/Qwen3-VL-4B-Instruct (FLUX.3 text_encoder: its joint_attention_dim 20480 = 8 stacked layers x 2560): 36 layers,
# width 2560, 32 heads of 128 over 8 kv heads, SwiGLU 9728, vocabulary tied to lm_head; vision tower 24 blocks of
# width 1024 (16 heads, MLP 4096), DeepStack at blocks 5, 11, 17, merged to 2560.
QWEN3_VL_4B = dict(
    text_config=dict(
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000, "mrope_section": [24, 20, 20]},
    ),
    vision_config=dict(
        depth=24,
        hidden_size=1024,
        intermediate_size=4096,
        num_heads=16,
        out_hidden_size=2560,
        num_position_embeddings=2304,
        deepstack_visual_indexes=[5, 11, 17],
    ),
    tie_word_embeddings=True,
)


@dataclass(frozen=True, kw_only=True)
class Component:
    """One pipeline component as released."""

    class_name: str
    """diffusers or transformers model class, e.g. "T5EncoderModel"."""
    config: Mapping | None = None
    """diffusers: `from_config` kwargs (None: the family's released config); transformers: config class kwargs."""
    config_class: str | None = None
    """transformers config class (e.g. "T5Config"); None for a diffusers model."""


@dataclass(frozen=True, kw_only=True)
class ReleasedPipeline:
    """A public checkpoint's modules by pipeline component name (schedulers and tokenizers left out)."""

    title: str
    """The checkpoint's name, e.g. "FLUX.1-dev"."""
    components: Mapping[str, Component]
    model_dir: str
    """The checkpoint folder a `dtp run` command names, e.g. "./FLUX.1-dev"."""
    size: tuple[int, int, int] | None = None
    """The (frames, height, width) the checkpoint is made to generate, where it differs from the family's usual
    clip (Wan2.1-T2V-14B: 81 x 720 x 1280, its 1.3B sibling 480p); None: the family's (images: 1024²)."""


def _transformers(class_name: str, config_class: str, config: Mapping) -> Component:
    return Component(class_name=class_name, config=config, config_class=config_class)


RELEASED_PIPELINES = {
    "flux-pipeline": ReleasedPipeline(
        title="FLUX.1-dev",
        components={
            "transformer": Component(class_name="FluxTransformer2DModel"),
            "text_encoder": _transformers("CLIPTextModel", "CLIPTextConfig", CLIP_L),
            "text_encoder_2": _transformers("T5EncoderModel", "T5Config", T5_XXL),
            "vae": Component(class_name="AutoencoderKL", config=FLUX_VAE),
        },
        model_dir="./FLUX.1-dev",
    ),
    "flux2-pipeline": ReleasedPipeline(
        title="FLUX.2-dev",
        components={
            "transformer": Component(class_name="Flux2Transformer2DModel"),
            "text_encoder": _transformers("Mistral3ForConditionalGeneration", "Mistral3Config", MISTRAL_SMALL_31),
            "vae": Component(class_name="AutoencoderKLFlux2", config={}),
        },
        model_dir="./FLUX.2-dev",
    ),
    "qwenimage-pipeline": ReleasedPipeline(
        title="Qwen-Image",
        components={
            "transformer": Component(class_name="QwenImageTransformer2DModel"),
            "text_encoder": _transformers("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", QWEN25_VL_7B),
            "vae": Component(class_name="AutoencoderKLQwenImage", config={}),
        },
        model_dir="./Qwen-Image",
    ),
    # Wan 2.1 T2V 14B: the diffusers class defaults of WanTransformer3DModel (40 layers, 40 heads of 128) and
    # AutoencoderKLWan are the 14B checkpoint's.
    "wan-pipeline": ReleasedPipeline(
        title="Wan2.1-T2V-14B",
        components={
            "transformer": Component(class_name="WanTransformer3DModel"),
            "text_encoder": _transformers("UMT5EncoderModel", "UMT5Config", UMT5_XXL),
            "vae": Component(class_name="AutoencoderKLWan", config={}),
        },
        model_dir="./Wan2.1-T2V-14B-Diffusers",
        size=(81, 720, 1280),
    ),
    # Wan2.1-VACE-14B: WanVACETransformer3DModel's class defaults (Wan 14B's 40 blocks, 8 VACE blocks), the 14B T2V
    # checkpoint's UMT5-XXL encoder and Wan VAE.
    "wan-vace-pipeline": ReleasedPipeline(
        title="Wan2.1-VACE-14B",
        components={
            "transformer": Component(class_name="WanVACETransformer3DModel"),
            "text_encoder": _transformers("UMT5EncoderModel", "UMT5Config", UMT5_XXL),
            "vae": Component(class_name="AutoencoderKLWan", config={}),
        },
        model_dir="./Wan2.1-VACE-14B-diffusers",
        size=(81, 720, 1280),
    ),
    # LTX-2: LTX2VideoTransformer3DModel's class defaults, Gemma 3 12B, and the video VAE at 32x / 8x in time (its
    # down blocks are spatial, temporal and two spatiotemporal ones; the class's fallback formula, patch x 2 per
    # scaling stage, would say 64x / 16x). The text connectors (LTX2TextConnectors: 49 stacked Gemma hidden states to
    # the video and audio text streams, 1.43 B), the audio VAE and the vocoder at their class defaults (assumed to be
    # the released configs, as for the transformer).
    "ltx2-pipeline": ReleasedPipeline(
        title="LTX-2",
        components={
            "transformer": Component(class_name="LTX2VideoTransformer3DModel"),
            "text_encoder": _transformers("Gemma3ForConditionalGeneration", "Gemma3Config", GEMMA3_12B),
            "vae": Component(
                class_name="AutoencoderKLLTX2Video",
                config={"spatial_compression_ratio": 32, "temporal_compression_ratio": 8},
            ),
            "connectors": Component(class_name="LTX2TextConnectors", config={}),
            "audio_vae": Component(class_name="AutoencoderKLLTX2Audio", config={}),
            "vocoder": Component(class_name="LTX2Vocoder", config={}),
        },
        model_dir="./LTX-2",
    ),
    # HunyuanVideo 1.5 (480p text-to-video): the family's released transformer, Qwen2.5-VL-7B's language model alone
    # (`Qwen2_5_VLTextModel`: the pipeline takes its hidden states), the glyph byT5 encoder (google/byt5-small's
    # encoder shape: assumed, its config is not written out here) and AutoencoderKLHunyuanVideo15's class defaults
    # (assumed to be the released ones).
    "hunyuanvideo15-pipeline": ReleasedPipeline(
        title="HunyuanVideo-1.5",
        components={
            "transformer": Component(class_name="HunyuanVideo15Transformer3DModel"),
            "text_encoder": _transformers("Qwen2_5_VLTextModel", "Qwen2_5_VLTextConfig", QWEN25_VL_7B["text_config"]),
            "text_encoder_2": _transformers("T5EncoderModel", "T5Config", BYT5_SMALL),
            "vae": Component(class_name="AutoencoderKLHunyuanVideo15", config={}),
        },
        model_dir="./HunyuanVideo-1.5-Diffusers-480p_t2v",
    ),
    # FLUX.3: Flux3Transformer2DModel's class defaults, Qwen3-VL-4B (its 8 stacked hidden states are the
    # transformer's 20480-wide text input) and FLUX.2's VAE (diffusers' modular FLUX.3 pipeline).
    "flux3-pipeline": ReleasedPipeline(
        title="FLUX.3",
        components={
            "transformer": Component(class_name="Flux3Transformer2DModel"),
            "text_encoder": _transformers("Qwen3VLForConditionalGeneration", "Qwen3VLConfig", QWEN3_VL_4B),
            "vae": Component(class_name="AutoencoderKLFlux2", config={}),
        },
        model_dir="./FLUX.3",
    ),
}
