"""Per-rank weight bytes / (pipeline bytes / tp) of whole pipelines: transformer only vs text encoders too.

Every component is built at full size on the meta device in bf16 and sharded on rank 0 of torch's
fake process group of `tp` ranks, as `dtp check` does for one model:

    before  the transformer sharded by its bundled plan, everything else whole (dtp on main)
    after   `dtp.parallelize_pipeline`: the text encoders sharded by their bundled plans as well

The VAE stays whole in both (no plan). Configs are the released checkpoints' (config.json values
written out below: no model hub here). Each text encoder gets the first of its bundled plans that fits
the degree (CLIP-L at tp=8: clip-mlp); one whose plans do not fit (tp must divide its heads and kv
heads) stays whole, and the table says why.

    python benchmarks/pipeline_memory.py      # prints the table, writes benchmarks/results/pipeline_memory.md
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import torch

import dtp
from dtp.errors import PlanError
from dtp.pipeline import WHOLE, parallelize_pipeline
from dtp.tools.fakepg import fake_world, meta_model

DEGREES = (2, 4, 8)
RESULTS = Path(__file__).resolve().parent / "results" / "pipeline_memory.md"

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

# name -> {component: (library, class name, config)}; the transformer uses dtp's full-size default config.
PIPELINES = {
    "FLUX.1-dev": {
        "transformer": ("diffusers", "FluxTransformer2DModel", None),
        "text_encoder": ("transformers", "CLIPTextModel", ("CLIPTextConfig", CLIP_L)),
        "text_encoder_2": ("transformers", "T5EncoderModel", ("T5Config", T5_XXL)),
        "vae": ("diffusers", "AutoencoderKL", FLUX_VAE),
    },
    "FLUX.2-dev": {
        "transformer": ("diffusers", "Flux2Transformer2DModel", None),
        "text_encoder": ("transformers", "Mistral3ForConditionalGeneration", ("Mistral3Config", MISTRAL_SMALL_31)),
        "vae": ("diffusers", "AutoencoderKLFlux2", {}),
    },
    "Qwen-Image": {
        "transformer": ("diffusers", "QwenImageTransformer2DModel", None),
        "text_encoder": ("transformers", "Qwen2_5_VLForConditionalGeneration", ("Qwen2_5_VLConfig", QWEN25_VL_7B)),
        "vae": ("diffusers", "AutoencoderKLQwenImage", {}),
    },
}


def build(library: str, class_name: str, config) -> torch.nn.Module:
    """One component on the meta device in bf16."""
    if library == "diffusers":
        return meta_model(class_name, config, dtype=torch.bfloat16)
    import transformers

    config_class, kwargs = config
    with torch.device("meta"):
        model = getattr(transformers, class_name)(getattr(transformers, config_class)(**kwargs))
    return model.to(torch.bfloat16).eval()


def measure(pipeline: str, tp: int, text_encoders: bool) -> dict:
    """{component: (whole bytes, this rank's bytes, plan or note)} on rank 0 of a fake group of `tp` ranks.

    `dtp.parallelize_pipeline` on the pipeline's components; text encoders left whole with
    `text_encoders=False`, or when their plans do not fit `tp` (the PlanError's reason is the note).
    """
    with fake_world(tp):
        mesh = dtp.make_mesh(tp=tp, device_type="cpu")
        pipe = SimpleNamespace(components={n: build(*spec) for n, spec in PIPELINES[pipeline].items()})
        whole = {name: WHOLE for name in pipe.components if name.startswith("text_encoder")}
        note = ""
        try:
            report = parallelize_pipeline(pipe, mesh, None if text_encoders else whole)
        except PlanError as exc:  # nothing was mutated: run again with the text encoders whole
            note = "whole: " + str(exc).split(": ", 2)[-1].split(";")[0]  # the first number tp does not divide
            report = parallelize_pipeline(pipe, mesh, whole)
    return {
        c.name: (c.whole_bytes, c.local_bytes, c.plan or (note if c.name.startswith("text_encoder") else "whole"))
        for c in report.components
    }


def ratio(components: dict, tp: int) -> float:
    whole = sum(w for w, _, _ in components.values())
    local = sum(loc for _, loc, _ in components.values())
    return local / (whole / tp)


def tables() -> list[str]:
    summary = ["| pipeline | total (bf16) | " + " | ".join(f"tp={tp} before | tp={tp} after" for tp in DEGREES) + " |"]
    summary.append("|" + "---|" * (2 + 2 * len(DEGREES)))
    details = ["| pipeline | tp | component | class | whole GB | per rank before GB | per rank after GB | plan after |"]
    details.append("|---|---|---|---|---|---|---|---|")
    for pipeline in PIPELINES:
        cells, total = [], 0
        for tp in DEGREES:
            before, after = measure(pipeline, tp, False), measure(pipeline, tp, True)
            total = sum(w for w, _, _ in after.values())
            cells += [f"{ratio(before, tp):.4f}", f"{ratio(after, tp):.4f}"]
            for name, (whole, local, plan) in after.items():
                class_name = PIPELINES[pipeline][name][1]
                details.append(
                    f"| {pipeline} | {tp} | {name} | {class_name} | {whole / 1e9:.3f} | {before[name][1] / 1e9:.3f} | "
                    f"{local / 1e9:.3f} | {plan} |"
                )
        summary.append(f"| {pipeline} | {total / 1e9:.2f} GB | " + " | ".join(cells) + " |")
    return summary + ["", "Per component:", ""] + details


def main() -> None:
    start = time.perf_counter()
    rows = tables()
    text = "\n".join(
        [
            "# Whole pipelines: per-rank weights / (pipeline weights / tp)",
            "",
            "Command: `python benchmarks/pipeline_memory.py` (meta device + torch's fake process group, bf16,",
            "released configs). before: only the transformer sharded (its bundled plan), text encoders and VAE",
            "whole on every rank. after: `dtp.parallelize_pipeline`, text encoders sharded by their bundled plans.",
            "The VAE stays whole. 1.000 is the physical limit.",
            "",
            *rows,
            "",
            f"Wall time of the script: {time.perf_counter() - start:.1f} s.",
        ]
    )
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text + "\n")


if __name__ == "__main__":
    main()
