"""Tiny random-weight FLUX.1 and Qwen-Image pipeline checkpoints, written once to a cache directory.

The demo and the tests need a real diffusers pipeline directory (model_index.json plus one folder
per component, safetensors weights) without a model hub. This module builds one from configs:

    transformer     FluxTransformer2DModel, dtp.tiny's config (4 heads of 16, 2 + 2 blocks)
    vae             AutoencoderKL, 2 levels (8, 16 channels): 32 x 32 pixels <-> 4 x 16 x 16 latents
    scheduler       FlowMatchEulerDiscreteScheduler with FLUX.1-dev's shift settings
    text_encoder    CLIPTextModel, 1 layer, width 16 (= the transformer's pooled_projection_dim)
    text_encoder_2  T5EncoderModel (v1.1, gated GELU), 1 layer, width 32 (= the transformer's joint_attention_dim)
    tokenizer(_2)   CLIP byte-level BPE and T5 unigram tokenizers over a vocabulary of single
                    characters, built in memory with transformers (no vocabulary files to download)

The Qwen-Image one (tiny_qwenimage_pipeline) has the same transformer size and a 1-layer Qwen2.5-VL
text encoder (4 heads, 2 kv heads); the text encoders' plans split them at tp=2. Prompts therefore go
through real (random) text encoders, so `dtp run --prompt ...`
exercises the same path as a real checkpoint. Every weight is drawn from a fixed seed per component, so the
checkpoint is the same on every machine and every first use. The checkpoints' text encoders and VAEs are then
perturbed (`tiny.perturb`: seeded noise on every parameter), so that no bias is zero and no norm weight one: a
slicing bug on one of them changes the image.
"""

from __future__ import annotations

import functools
import os
import shutil
import string
import tempfile
from pathlib import Path

import torch

from . import FAMILIES
from .tiny import perturb, tiny_model

FLUX_TRANSFORMER_CLASS = "FluxTransformer2DModel"
DEMO_PROMPT = "a cat holding a sign that says hello"  # `dtp demo`'s prompt (and its tests')

# FLUX.1-dev's scheduler settings (resolution-dependent shift of the sigmas).
SCHEDULER_CONFIG = dict(
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
)
VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    block_out_channels=(8, 16),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=32,
    use_quant_conv=False,
    use_post_quant_conv=False,
    shift_factor=0.0609,
    scaling_factor=1.5035,
)


def cache_dir() -> Path:
    """$DTP_CACHE, else ~/.cache/dtp."""
    return Path(os.environ.get("DTP_CACHE") or Path.home() / ".cache" / "dtp")


def tiny_checkpoint(model: str = "flux", root: Path | str | None = None) -> Path:
    """The tiny `model` ("flux" or "qwenimage") pipeline directory under `root` (default
    `cache_dir()`), created on first use.

    It is written to a temporary sibling and renamed into place, so a crashed or concurrent first
    use never leaves a half-written checkpoint behind.
    """
    if model not in CHECKPOINTS:
        raise ValueError(f"no tiny pipeline named {model!r}; choose one of {', '.join(CHECKPOINTS)}.")
    name, build = CHECKPOINTS[model]
    target = Path(root or cache_dir()) / name
    if (target / "model_index.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build().save_pretrained(tmp, safe_serialization=True)
        os.replace(tmp, target)
    except OSError:
        if not (target / "model_index.json").exists():  # not just a lost race with another writer
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def tiny_flux_pipeline(*, perturbed: bool = False):
    """The tiny FluxPipeline in memory, every component drawn from its own fixed seed; `perturbed`: the text encoders
    and the VAE moved off their default init (`tiny.perturb`), as the cached checkpoint is."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline

    cfg = FAMILIES[FLUX_TRANSFORMER_CLASS].tiny
    torch.manual_seed(1)
    vae = _maybe_perturb(AutoencoderKL(**VAE_CONFIG), 1, perturbed)
    assert vae.config.latent_channels * 4 == cfg["in_channels"], "Flux packs 2 x 2 latent patches"
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=_maybe_perturb(clip_text_encoder(width=cfg["pooled_projection_dim"], seed=2), 2, perturbed),
        tokenizer=clip_tokenizer(),
        text_encoder_2=_maybe_perturb(t5_encoder(width=cfg["joint_attention_dim"], seed=3), 3, perturbed),
        tokenizer_2=t5_tokenizer(),
        # Every weight ~ N(0, 0.2): large enough that the transformer shapes the image (zeroing its
        # proj_out moves pixels by 0.15 on average) and a 1 % weight error fails the pixel tolerance.
        transformer=tiny_model(FLUX_TRANSFORMER_CLASS, seed=0),
    )


def _maybe_perturb(module: torch.nn.Module, seed: int, perturbed: bool) -> torch.nn.Module:
    return perturb(module, seed) if perturbed else module


# Characters both tokenizers know: everything a prompt of plain English text uses.
_CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation


def clip_tokenizer():
    from transformers import CLIPTokenizer

    # Byte-level BPE without merges: one token per character, "</w>" marks a word's last one.
    specials = ["<|startoftext|>", "<|endoftext|>"]
    pieces = specials + list(_CHARS) + [c + "</w>" for c in _CHARS]
    return CLIPTokenizer(vocab={p: i for i, p in enumerate(pieces)}, merges=[], model_max_length=77)


def t5_tokenizer():
    """A T5 tokenizer of single characters, for every tiny pipeline with a T5-family text encoder."""
    from transformers import T5Tokenizer

    # Unigram over single characters (each also with the word-start marker), no sentinel tokens.
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(p, -3.0) for c in _CHARS for p in (c, "\u2581" + c)]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=512)


def clip_text_encoder(width: int, seed: int):
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    config = CLIPTextConfig(
        vocab_size=len(clip_tokenizer()),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=77,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    return CLIPTextModel(config).eval()


def t5_encoder(width: int, seed: int, model_class=None, vocab_size: int | None = None):
    """A 1-layer T5-family encoder of `width` (T5 v1.1 / UMT5: gated GELU, as FLUX.1's T5-XXL: wi_0, wi_1 -> wo),
    weights from `seed`; `model_class` defaults to transformers' T5EncoderModel (UMT5EncoderModel for Wan);
    `vocab_size` to the tiny T5 tokenizer's (ByT5's is 384)."""
    from transformers import T5EncoderModel

    model_class = model_class or T5EncoderModel
    torch.manual_seed(seed)
    config = model_class.config_class(
        vocab_size=vocab_size or len(t5_tokenizer()),
        d_model=width,
        d_kv=width // 4,
        d_ff=2 * width,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu",
        pad_token_id=0,
        eos_token_id=1,
    )
    return model_class(config).eval()


# ---- Qwen-Image ------------------------------------------------------------------------------

QWEN_TRANSFORMER_CLASS = "QwenImageTransformer2DModel"
QWEN_VAE_CONFIG = dict(
    base_dim=8,
    z_dim=4,
    dim_mult=[1, 2],
    num_res_blocks=1,
    temperal_downsample=[False],
    latents_mean=[0.0] * 4,
    latents_std=[1.0] * 4,
)
_QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # the chat template's markers


def tiny_qwenimage_pipeline(*, perturbed: bool = False):
    """The tiny QwenImagePipeline in memory: transformer, VAE (8, 16 channels), scheduler, and a
    1-layer Qwen2.5-VL text encoder of width 32 (= the transformer's joint_attention_dim).

    The tokenizer is byte-level BPE without merges (one token per byte) plus the chat markers, so
    the pipeline's prompt template tokenizes into more tokens than with the real vocabulary; the
    pipeline's fixed 34-token drop then keeps part of the template, which only changes what a random
    encoder sees, not the shapes the transformer gets.
    """
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    cfg = FAMILIES[QWEN_TRANSFORMER_CLASS].tiny
    torch.manual_seed(1)
    vae = _maybe_perturb(AutoencoderKLQwenImage(**QWEN_VAE_CONFIG), 1, perturbed)
    assert vae.config.z_dim * 4 == cfg["in_channels"], "Qwen-Image packs 2 x 2 latent patches"
    tokenizer = qwen_tokenizer()
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=_maybe_perturb(_qwen_text_encoder(len(tokenizer), cfg["joint_attention_dim"], 2), 2, perturbed),
        tokenizer=tokenizer,
        transformer=tiny_model(QWEN_TRANSFORMER_CLASS, seed=0),
    )


def qwen_tokenizer():
    """Byte-level BPE without merges (one token per byte) plus the chat markers, built in memory."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    pieces = _QWEN_SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Qwen2Tokenizer(vocab={p: i for i, p in enumerate(pieces)}, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": _QWEN_SPECIALS[1:]})  # never split
    return tokenizer


def _qwen_text_encoder(vocab_size: int, width: int, seed: int):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    head_dim = width // 4
    config = Qwen2_5_VLConfig(
        text_config=dict(
            # The embedding table is padded to a multiple of 8 rows (as the real one is, 152064 for a
            # 151665-token vocabulary), so that it splits over tp in {1, 2, 4, 8}.
            vocab_size=-(-vocab_size // 8) * 8,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            # multimodal RoPE: the sections split head_dim / 2 rotary frequencies over (t, h, w)
            rope_scaling={"type": "mrope", "mrope_section": [1, 1, head_dim // 2 - 2]},
        ),
        # Never called for text-only prompts, but part of the model class: the smallest one.
        vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=width, fullatt_block_indexes=[0]
        ),
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


# model name -> (directory name, builder); bump a directory's suffix when its recipe changes, so that a checkpoint
# cached by an older recipe is not reused (v3: text encoders and VAEs perturbed off their default init). The
# in-memory builders stay unperturbed by default: tests tuned to their exact values (the cache tests' thresholds
# in tests/distributed/cache_cases.py) use them.
CHECKPOINTS = {
    "flux": ("tiny-flux-pipeline-v3", functools.partial(tiny_flux_pipeline, perturbed=True)),
    "qwenimage": ("tiny-qwenimage-pipeline-v3", functools.partial(tiny_qwenimage_pipeline, perturbed=True)),
}
