"""Worker side of the text-encoder parity tests: one spawned group runs every tiny text encoder."""

import torch

import dtp
from dtp.runtime.memory import local_param_bytes
from dtp.testing.tiny_text import TEXT_CLASSES, hidden_states, tiny_grouped_qwen, tiny_text_inputs, tiny_text_model

# (class, plan): the bundled plan plan_for picks (None), and the variants parallelize_pipeline falls back to.
CASES = [(cls, None) for cls in TEXT_CLASSES] + [
    ("CLIPTextModel", "clip-mlp"),
    ("CLIPTextModelWithProjection", "clip-projection-mlp"),
]


GROUPED = "Qwen2_5_VL 6q/2kv pad"  # tiny_grouped_qwen with pad=True: groups of 3 query heads padded at tp=4
QWEN_7B_HEADS = "Qwen2_5_VL 28q/4kv pad"  # the 7B's heads (groups of 7 pad to 8 at tp=8), FFN 150 -> 152
PADDED = {GROUPED: {}, QWEN_7B_HEADS: dict(heads=28, kv_heads=4, intermediate=150)}
# Released head shapes in small (heads of 8): gemma-3-12b's 16 query / 8 kv heads, whose q_proj (16 x 8 = 128) is
# wider than the model (32), as 16 x 256 = 4096 is wider than 3840; Qwen3-VL-4B's 32 query / 8 kv heads.
RELEASED_HEADS = {
    "Gemma3 16q/8kv": ("Gemma3ForConditionalGeneration", dict(num_attention_heads=16, num_key_value_heads=8)),
    "Qwen3VL 32q/8kv": ("Qwen3VLForConditionalGeneration", dict(num_attention_heads=32, num_key_value_heads=8)),
}


def case_id(cls, plan):
    return cls if plan is None else f"{cls}/{plan}"


def build(cls):
    if cls in RELEASED_HEADS:
        return tiny_text_model(RELEASED_HEADS[cls][0], **RELEASED_HEADS[cls][1])
    return tiny_grouped_qwen(**PADDED[cls]) if cls in PADDED else tiny_text_model(cls)


@torch.no_grad()
def run_text_cases(rank, world_size, tp, cases=CASES, pad=False):
    """Per case: (max over hidden states of max |sharded - ref| / max |ref|, local bytes / whole bytes)."""
    mesh = dtp.make_mesh(tp=tp)
    inputs = tiny_text_inputs()
    results = {}
    for cls, plan in cases:
        reference = build(cls)
        ref = hidden_states(reference, inputs)
        plan = plan and dtp.load_plan(plan)  # None: plan_for
        sharded = dtp.parallelize(build(cls), mesh, plan, pad=pad or cls in PADDED)
        out = hidden_states(sharded, inputs)
        assert len(out) == len(ref), cls
        relative = max(float((o - r).abs().max() / r.abs().max()) for o, r in zip(out, ref))
        share = local_param_bytes(text_part(sharded)) / local_param_bytes(text_part(reference))
        results[case_id(cls, plan and plan.name)] = (relative, share)
    return results


def text_part(model):
    """What a text-to-image pipeline runs: a vision-language class's language model (its vision tower, sharded
    too, has its own test: test_vision_parity.py)."""
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", model)
