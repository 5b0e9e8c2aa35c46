"""Worker side of the vision-tower parity test: one 4-process group shards every tiny vision tower at tp=4
(the whole group) and at tp=2 (the tp axis of a cp=2 x tp=2 mesh: two tp groups, each checked)."""

import torch

import dtp
from dtp.runtime.mesh import tp_submesh
from dtp.testing.plans import edited
from dtp.testing.scope import full_run
from dtp.testing.tiny_vision import (
    GEMMA3,
    QWEN3_VL,
    VISION_CLASSES,
    tiny_vision_inputs,
    tiny_vision_model,
    vision_bytes,
    vision_outputs,
)

# Negative controls, (class, tp, plan name, changed rules, attention globs): Qwen2.5-VL's fused qkv split
# as blocks [1, 2] (q, then k and v as one block), so at tp=4 rank 0 would hold q head 0 and k heads 0, 1 as
# its "q, k, v" head. Block 32 is attn.proj's width, so the pair rule passes it; it used to run and miss the
# tolerance, and since the head-alignment rule (resolve/alignment.py) `prepare` refuses it, naming the key.
# (A single colwise block is refused by the pair rule: tests/unit/test_text_plans.py.) `edited` writes the
# attention globs out, so the ones the bundled plan infers are listed.
CONTROLS = {
    "Qwen2_5_VLForConditionalGeneration/tp=4/qkv-blocks-1-2": (
        "Qwen2_5_VLForConditionalGeneration",
        4,
        "qwen2_5_vl",
        {"model.visual.blocks.*.attn.qkv": {"style": "packed_colwise", "blocks": [1, 2]}},
        ["model.language_model.layers.*.self_attn", "model.visual.blocks.*.attn"],
    ),
}


# pad=True, (class, tp, vision config overrides): 6 heads and a SwiGLU intermediate of 54, which tp=4 divides
# no more than tp=8 divides Qwen2.5-VL-7B's 3420; zero-padded to 8 heads (qkv blocks 48 -> 64) and 56 units.
PADDED = {
    "Qwen2_5_VLForConditionalGeneration/tp=4/pad": (
        "Qwen2_5_VLForConditionalGeneration",
        4,
        dict(hidden_size=48, num_heads=6, intermediate_size=54),
    ),
}


# Gemma 3's and Qwen3-VL's towers at tp=2 repeat the kind their tp=4 case covers (measured 2.7e-7 / 4.1e-7):
# DTP_FULL=1 only, so the default run of this group stays short.
FULL_ONLY = {(GEMMA3, 2), (QWEN3_VL, 2)}


def case_id(cls, tp):
    return f"{cls}/tp={tp}"


def default_cases() -> list[tuple[str, int]]:
    """(class, tp) of the run: every vision class at tp 2 and 4, less FULL_ONLY unless DTP_FULL=1."""
    return [(cls, tp) for cls in VISION_CLASSES for tp in (4, 2) if full_run() or (cls, tp) not in FULL_ONLY]


@torch.no_grad()
def run_vision_cases(rank, world_size):
    """{case: (max over outputs of max |sharded - ref| / max |ref|, local vision bytes / whole vision bytes)}."""
    meshes = {4: dtp.make_mesh(tp=4), 2: tp_submesh(dtp.make_mesh(tp=2, cp=2))}
    inputs = {cls: tiny_vision_inputs(cls) for cls in VISION_CLASSES}
    references = {cls: tiny_vision_model(cls) for cls in VISION_CLASSES}
    refs = {cls: vision_outputs(references[cls], inputs[cls]) for cls in VISION_CLASSES}
    results = {}
    for cls, tp in default_cases():
        sharded = dtp.parallelize(tiny_vision_model(cls), meshes[tp])  # the bundled plan (plan_for)
        results[case_id(cls, tp)] = _compare(sharded, references[cls], refs[cls], inputs[cls])
    for case, (cls, tp, name, changes, attention) in CONTROLS.items():
        plan = edited(dtp.load_plan(name), changes, attention)
        try:
            sharded = dtp.parallelize(tiny_vision_model(cls), meshes[tp], plan)
            results[case] = _compare(sharded, references[cls], refs[cls], inputs[cls])
        except dtp.PlanError as exc:  # refused before anything changed: what the control must get
            results[case] = str(exc)
    for case, (cls, tp, vision) in PADDED.items():
        reference = tiny_vision_model(cls, **vision)
        sharded = dtp.parallelize(tiny_vision_model(cls, **vision), meshes[tp], pad=True)
        results[case] = _compare(sharded, reference, vision_outputs(reference, inputs[cls]), inputs[cls])
    return results


def _compare(sharded, reference, ref, inputs):
    out = vision_outputs(sharded, inputs)
    assert len(out) == len(ref)
    relative = max(float((o - r).abs().max() / r.abs().max()) for o, r in zip(out, ref))
    return relative, vision_bytes(sharded) / vision_bytes(reference)
