"""Tiny random-weight configs of the bundled architectures, with matching inputs.

Used by the demo, the tests and the benchmarks: real diffusers classes, small widths, so a forward
runs in milliseconds on CPU while keeping every structural feature (both block kinds, packed
projections, refiners). Head counts and widths allow tp = 1, 2, 4 unless overridden.
"""

from __future__ import annotations

import torch

from ..models import example_inputs, model_class
from ..plan import bundled_plan_names, load_plan

TINY_CONFIGS = {
    "FluxTransformer2DModel": dict(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(4, 6, 6),
    ),
    "Flux2Transformer2DModel": dict(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        timestep_guidance_channels=32,
        mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=True,
    ),
    "QwenImageTransformer2DModel": dict(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
    ),
    "ZImageTransformer2DModel": dict(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=4,
        dim=96,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=4,
        n_kv_heads=4,
        cap_feat_dim=32,
        axes_dims=[8, 8, 8],
        axes_lens=[64, 32, 32],
    ),
    # Issue 10 coverage: 4 heads of 16 (tp 1, 2, 4), two blocks of each kind, so that heterogeneous
    # blocks (SD3's and Mochi's context-only last block, SD3.5-M's dual attention) are present.
    # Lumina2: 8 q / 4 kv heads of 8 (GQA; tp 1, 2, 4, 8: at tp 8 each kv head is shared by 2 ranks).
    # Mochi: heads of 24 so that both SwiGLU halves (256 and 64 wide) divide by 4.
    # Cosmos: no padding-mask channel (its resize needs torchvision). HiDream: 4 routed experts,
    # top-2, as HiDream-I1.
    "PixArtTransformer2DModel": dict(
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        cross_attention_dim=64,
        sample_size=8,
        patch_size=2,
        caption_channels=32,
        use_additional_conditions=False,
    ),
    "SD3Transformer2DModel": dict(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=3,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        caption_projection_dim=64,
        pooled_projection_dim=16,
        out_channels=4,
        pos_embed_max_size=16,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    ),
    "AuraFlowTransformer2DModel": dict(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_mmdit_layers=1,
        num_single_dit_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        caption_projection_dim=64,
        out_channels=4,
        pos_embed_max_size=64,
    ),
    "CogView4Transformer2DModel": dict(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        text_embed_dim=32,
        time_embed_dim=16,
        condition_dim=8,
        pos_embed_max_size=16,
        sample_size=8,
        rope_axes_dim=(8, 8),
    ),
    "CogVideoXTransformer3DModel": dict(
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        time_embed_dim=16,
        text_embed_dim=32,
        num_layers=2,
        sample_width=8,
        sample_height=8,
        sample_frames=5,
        patch_size=2,
        max_text_seq_length=8,
    ),
    "ChromaTransformer2DModel": dict(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
        approximator_num_channels=16,
        approximator_hidden_dim=32,
        approximator_layers=1,
    ),
    "HunyuanVideoTransformer3DModel": dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=4,
        attention_head_dim=16,
        num_layers=1,
        num_single_layers=2,
        num_refiner_layers=1,
        patch_size=2,
        patch_size_t=1,
        text_embed_dim=32,
        pooled_projection_dim=16,
        rope_axes_dim=(4, 6, 6),
        guidance_embeds=True,
    ),
    "HunyuanImageTransformer2DModel": dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=4,
        attention_head_dim=16,
        num_layers=1,
        num_single_layers=2,
        num_refiner_layers=1,
        patch_size=(1, 1),
        text_embed_dim=32,
        rope_axes_dim=(8, 8),
    ),
    "Lumina2Transformer2DModel": dict(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        hidden_size=64,
        num_layers=2,
        num_refiner_layers=1,
        num_attention_heads=8,
        num_kv_heads=4,
        multiple_of=16,
        axes_dim_rope=(2, 2, 4),
        axes_lens=(32, 32, 32),
        cap_feat_dim=32,
    ),
    "SanaTransformer2DModel": dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=4,
        attention_head_dim=16,
        num_layers=2,
        num_cross_attention_heads=4,
        cross_attention_head_dim=16,
        cross_attention_dim=64,
        caption_channels=32,
        sample_size=8,
        patch_size=1,
    ),
    "WanTransformer3DModel": dict(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=16,
        ffn_dim=96,
        num_layers=2,
        rope_max_seq_len=32,
    ),
    "SkyReelsV2Transformer3DModel": dict(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=16,
        ffn_dim=96,
        num_layers=2,
        rope_max_seq_len=32,
    ),
    "LTXVideoTransformer3DModel": dict(
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=16,
        cross_attention_dim=64,
        num_layers=2,
        caption_channels=32,
    ),
    "MochiTransformer3DModel": dict(
        patch_size=2,
        num_attention_heads=4,
        attention_head_dim=24,
        num_layers=2,
        pooled_projection_dim=24,
        in_channels=4,
        text_embed_dim=32,
        time_embed_dim=16,
        max_sequence_length=8,
    ),
    "CosmosTransformer3DModel": dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=4,
        attention_head_dim=16,
        num_layers=2,
        text_embed_dim=32,
        adaln_lora_dim=8,
        max_size=(4, 16, 16),
        patch_size=(1, 2, 2),
        concat_padding_mask=False,
    ),
    "HiDreamImageTransformer2DModel": dict(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=4,
        caption_channels=[32, 16],
        text_emb_dim=16,
        num_routed_experts=4,
        num_activated_experts=2,
        axes_dims_rope=(8, 4, 4),
        max_resolution=(16, 16),
        llama_layers=[0, 1],
    ),
    "QwenImage21Transformer2DModel": dict(
        patch_size=1,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        context_in_dim=32,
        axes_dims_rope=(4, 6, 6),
    ),
}


def plan_classes() -> dict[str, str]:
    """Bundled plan name -> the tiny-config class it is written for (read from the plans' `models:`)."""
    found = {}
    for name in bundled_plan_names():
        classes = [c for c in load_plan(name).models if c in TINY_CONFIGS]
        if classes:
            found[name] = classes[0]
    return found


PLAN_CLASSES = plan_classes()


def tiny_model(class_name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny instance with weights drawn from `seed` (identical on every rank), in eval mode."""
    torch.manual_seed(seed)
    model = model_class(class_name)(**{**TINY_CONFIGS[class_name], **overrides})
    # diffusers zero-initializes some output layers; random values make a wrong shard visible.
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    return model.eval()


def tiny_inputs(
    class_name: str,
    seed: int = 1,
    batch: int = 1,
    img_tokens: int = 16,
    txt_tokens: int = 8,
    config: dict | None = None,
) -> dict:
    """Keyword arguments for one forward of the tiny model (same on every rank for a fixed seed).

    `config` (default: the tiny one) sets the widths, so full-size configs get full-size shapes.
    """
    cfg = TINY_CONFIGS[class_name] if config is None else config
    return example_inputs(class_name, cfg, seed=seed, batch=batch, img_tokens=img_tokens, txt_tokens=txt_tokens)


def output_tensor(output) -> torch.Tensor:
    """The sample of a diffusers model output as one fp32 tensor.

    A tuple's first element, or the tensor itself; a list of per-image tensors (Z-Image) is stacked
    when the images have one shape, else flattened and concatenated (images of different sizes).
    """
    out = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(out, (list, tuple)):
        return out.float()
    if len({tuple(o.shape) for o in out}) == 1:
        return torch.stack([o.float() for o in out])
    return torch.cat([o.float().flatten() for o in out])
