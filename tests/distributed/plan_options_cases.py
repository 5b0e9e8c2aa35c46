"""Worker side of test_plan_options_parity.py: bundled plans on tiny models built under config options that change which
modules exist (issue 45), each at tp=2 against one process."""

from __future__ import annotations

from functools import partial

import dtp
from dtp.families import FAMILIES
from dtp.testing.parity import forward_parity
from dtp.testing.scope import full_run
from dtp.testing.tiny import PLAN_CLASSES, tiny_inputs, tiny_model

BATCH = 2
I2V = {"image_dim": 16, "added_kv_proj_dim": 64}  # Wan 2.1 I2V's CLIP image branch at the tiny width

# (plan, overrides): the options of each bundled plan's class whose flip changes the module tree and whose forward
# the family's inputs drive (`docs/plans.md`, "Plans follow the config"). The first two run by default.
DEFAULT_CASES = (("wan_animate", {"added_kv_proj_dim": None}), ("wan", I2V))
FULL_CASES = (
    ("wan", {"image_dim": 16}),
    ("skyreels_v2", I2V),
    ("wan_vace", I2V),
    ("chronoedit", I2V),
    ("helios", {"added_kv_proj_dim": 64}),
    ("anyflow", {"image_dim": 16}),
    ("hunyuanvideo_framepack", {"guidance_embeds": False}),
    ("consisid", {"is_train_face": False}),
    ("latte", {"cross_attention_dim": None}),
    ("nucleusmoe", {"moe_enabled": False}),
    ("ltx2", {"gated_attn": True, "audio_gated_attn": True}),  # to_gate_logits colwise: a gate per head
    ("motif_video", {"enable_text_cross_attention_dual": False}),
    ("easyanimate", {"add_norm_text_encoder": True}),
    ("easyanimate", {"after_norm": True}),
    ("easyanimate", {"text_embed_dim_t5": 16}),
    ("flux2", {"guidance_embeds": False}),
    ("zimage", {"qk_norm": False}),
    ("zimage", {"siglip_feat_dim": 16}),
    ("sd3", {"qk_norm": None}),
    ("hunyuanvideo", {"guidance_embeds": False}),
    ("hunyuanimage", {"text_embed_2_dim": 16}),
    ("hunyuanimage", {"use_meanflow": True}),
    ("hunyuanvideo15", {"use_meanflow": True}),
    ("hunyuandit", {"use_style_cond_and_image_meta_size": True}),
    ("bria_fibo", {"guidance_embeds": True}),
    ("prx", {"bottleneck_size": 16}),
    ("prx", {"resolution_embeds": True}),
)


def case_id(plan: str, overrides: dict) -> str:
    return f"{plan}[{','.join(f'{k}={v}' for k, v in overrides.items())}]"


def run_options(rank, world_size):
    mesh = dtp.make_mesh(tp=world_size)
    cases = DEFAULT_CASES + (FULL_CASES if full_run() else ())
    results = {}
    for plan, overrides in cases:
        cls = PLAN_CLASSES[plan]
        config = {**FAMILIES[cls].tiny, **overrides}
        inputs = tiny_inputs(cls, batch=BATCH, config=config)
        make = partial(tiny_model, cls, **overrides)
        try:
            results[case_id(plan, overrides)] = forward_parity(make, inputs, mesh, dtp.load_plan(plan)).relative
        except Exception as exc:  # reported per case, so that one refusal does not hide the others
            results[case_id(plan, overrides)] = f"{type(exc).__name__}: {exc}"
    return results
