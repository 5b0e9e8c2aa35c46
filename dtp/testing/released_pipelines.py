"""Tiny random-weight versions of released video pipelines, whole (every component diffusers' pipeline takes), for
`dtp run` end to end:

    WanVACEPipeline         the tiny Wan text-to-video parts (`conditioned_pipelines.tiny_wan_video_pipeline`)
                            with a VACE transformer: its control branch sees the zero "video" and full mask the
                            pipeline makes without a conditioning video (4 latent channels x 2 + 2 x 2 mask = 12)
    HunyuanVideo15Pipeline  Qwen2.5-VL text model (width 32 = text_embed_dim), ByT5 glyph encoder (width 24 =
                            text_embed_2_dim; byte tokenizer, built without files), the 3-level HunyuanVideo 1.5
                            VAE of `tiny_vae` (x4 in space and time: 5 frames <-> 2 latent frames) and diffusers'
                            ClassifierFreeGuidance guider. The pipeline pads the chat-formatted prompt to 1000 tokens
                            after cropping the 108 of its template (as released): the text sequence is 1000 long
    Flux3ModularPipeline    diffusers' modular FLUX.3 (Flux3AutoBlocks): the tiny Flux3Transformer2DModel (text
                            width 64), a 2-layer Qwen3-VL whose hidden states 1 and 2 are stacked (32 + 32 = 64:
                            `FLUX3_CALL`'s text_encoder_out_layers), FLUX.2's 2-level VAE (x4 with the 2 x 2
                            packing: 32 x 32 pixels <-> 8 x 8 latent tokens) and the byte tokenizer; the scheduler,
                            guider (classifier-free, two transformer calls a step) and image processor are the
                            blocks' own defaults. No prompt upsampler: the prompt is encoded as given.
                            `save_tiny_flux3` saves it with the tokenizer folder laid out as Qwen3-VL's processor
                            (an `AutoProcessor` component, as released), which transformers cannot build without
                            torchvision: `dtp.pipeline.modular` then reads the tokenizer text-only

Every weight is drawn from a fixed seed, the same on every rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..families.pipelines import qwen_tokenizer, t5_encoder
from .conditioned_pipelines import tiny_flux2_vae, tiny_wan_video_pipeline
from .tiny import TINY_CONFIGS, tiny_model
from .tiny_text import tiny_text_model
from .tiny_vae import tiny_vae

WAN_VACE_CALL = dict(height=16, width=16, num_frames=5, max_sequence_length=16)
HUNYUAN15_CALL = dict(height=32, width=32, num_frames=5)
FLUX3_CALL = dict(height=32, width=32, text_encoder_out_layers=[1, 2])
_BYT5_VOCAB = 384  # 256 bytes + 3 specials + 125 extra ids: ByT5Tokenizer's fixed vocabulary
# System and user text in the chat markers (the pipeline formats a system message and the prompt as a chat).
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>{% endif %}"
)


def tiny_wan_vace_pipeline():
    """The tiny WanVACEPipeline (text to video; no conditioning video, reference images or masks)."""
    from diffusers import WanVACEPipeline

    parts = tiny_wan_video_pipeline().components
    vae = parts["vae"]
    control = 2 * vae.config.z_dim + vae.config.scale_factor_spatial**2  # inactive + reactive latents, the mask
    transformer = tiny_model("WanVACETransformer3DModel", seed=0, vace_in_channels=control)
    keep = ("tokenizer", "text_encoder", "vae", "scheduler")
    return WanVACEPipeline(**{name: parts[name] for name in keep}, transformer=transformer)


def tiny_hunyuanvideo15_pipeline():
    """The tiny HunyuanVideo15Pipeline (text to video)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    config = TINY_CONFIGS["HunyuanVideo15Transformer3DModel"]
    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = _CHAT_TEMPLATE
    width = config["text_embed_dim"]
    torch.manual_seed(2)
    text_encoder = Qwen2_5_VLTextModel(
        Qwen2_5_VLTextConfig(
            vocab_size=-(-len(tokenizer) // 8) * 8,  # padded to split over tp, as the released table is
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=3,  # the pipeline takes the third hidden state from the end
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            rope_scaling={"type": "mrope", "mrope_section": [1, 1, width // 8 - 2]},
        )
    ).eval()
    # ByT5 glyph encoder of the transformer's second text width
    text_encoder_2 = t5_encoder(config["text_embed_2_dim"], seed=3, vocab_size=_BYT5_VOCAB)
    return HunyuanVideo15Pipeline(
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=tiny_model("HunyuanVideo15Transformer3DModel", seed=0),
        vae=tiny_vae("AutoencoderKLHunyuanVideo15", seed=1),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),  # the released one's: a fixed shift, no mu
        text_encoder_2=text_encoder_2,
        tokenizer_2=ByT5Tokenizer(),
        guider=ClassifierFreeGuidance(guidance_scale=3.0),
    )


def tiny_flux3_pipeline():
    """The tiny Flux3ModularPipeline (text to image), its from_pretrained components set (see the module docstring)."""
    from diffusers import Flux3ModularPipeline

    layers = len(FLUX3_CALL["text_encoder_out_layers"])
    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = _CHAT_TEMPLATE
    text_encoder = tiny_text_model("Qwen3VLForConditionalGeneration", seed=2, vocab_size=-(-len(tokenizer) // 8) * 8)
    width = text_encoder.config.text_config.hidden_size
    transformer = tiny_model("Flux3Transformer2DModel", seed=0, joint_attention_dim=layers * width)
    vae = tiny_flux2_vae(transformer.config.in_channels // 4)  # the transformer packs 2 x 2 latents
    pipe = Flux3ModularPipeline()  # Flux3AutoBlocks; scheduler, guider and image processor from their configs
    pipe.update_components(transformer=transformer, text_encoder=text_encoder, tokenizer=tokenizer, vae=vae)
    return pipe


# The processor files of Qwen3-VL beside its tokenizer's (the `tokenizer` component of a released FLUX.3 folder).
_QWEN3_VL_PROCESSOR = {
    "processor_config.json": {"processor_class": "Qwen3VLProcessor"},
    "preprocessor_config.json": {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor",
    },
    "video_preprocessor_config.json": {
        "video_processor_type": "Qwen3VLVideoProcessor",
        "processor_class": "Qwen3VLProcessor",
    },
}


def save_tiny_flux3(folder) -> None:
    """`tiny_flux3_pipeline()` saved as a modular pipeline folder (`modular_model_index.json`), its `tokenizer`
    folder made Qwen3-VL's processor: the processor configs beside the tokenizer files, the index entry an
    `AutoProcessor` (what `Flux3TextEncoderStep` expects)."""
    folder = Path(folder)
    tiny_flux3_pipeline().save_pretrained(str(folder), overwrite_modular_index=True)
    for name, config in _QWEN3_VL_PROCESSOR.items():
        (folder / "tokenizer" / name).write_text(json.dumps(config))
    index = json.loads((folder / "modular_model_index.json").read_text())
    _, _, spec = index["tokenizer"]
    index["tokenizer"] = ["transformers", "Qwen3VLProcessor", {**spec, "type_hint": ["transformers", "AutoProcessor"]}]
    (folder / "modular_model_index.json").write_text(json.dumps(index, indent=2))
