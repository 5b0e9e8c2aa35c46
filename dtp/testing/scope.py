"""Which cases the suite runs. The default run keeps one case of each kind (a model, a mesh, a config); the
further cases of a covered kind run with DTP_FULL=1 (`pytest.mark.full`, and spawned groups that do less work).

The family-wide modules (every bundled plan: tp and cp parity, padded tp=3, suggest walks) run by default one
family per structural kind: the families named in `KINDS`. Any other family repeats a kind one of them covers
(FLUX.1's layout, Wan's blocks, ...) and runs with DTP_FULL=1, so a new family costs the default run nothing unless
it brings a new kind of block, attention or conditioning, and then it gets a line here.
"""

import os

# plan -> the structural kind it stands for in the default run (docs/testing.md, "Families").
KINDS = {
    "flux": "double + single stream MMDiT, packed [attn | mlp] single-block output",
    "flux2": "fused qkv + SwiGLU MLP Linears, modulation shared by the blocks",
    "qwenimage": "dual stream MMDiT, text mask, separate image / text MLPs",
    "zimage": "single stream with noise / context refiners, caption mask",
    "qwenimage21": "block-causal joint attention around condition images",
    "chroma": "FLUX.1 blocks modulated by an approximator (no AdaLN Linears)",
    "flux3": "mode blocks per stream (text / image / image condition)",
    "ovisimage": "FLUX.1 layout with whole single-block MLPs (held sizes) and a SwiGLU FFN",
    "hidream": "routed MoE experts",
    "sd3": "MMDiT whose last block is context-pre-only",
    "auraflow": "MMDiT + single blocks with register tokens",
    "cogview4": "joint attention, one FFN run on both streams",
    "cogvideox": "joint attention over text + video, expert AdaLN",
    "consisid": "CogVideoX blocks + a perceiver face extractor",
    "hunyuanvideo": "double + single stream video with a token refiner",
    "lumina2": "GQA, refiners, one joint sequence",
    "pixart": "cross-attention DiT, AdaLN-single",
    "sana": "linear attention, convolutional Mix-FFN",
    "wan": "self + cross attention video, QK RMSNorm across heads",
    "wan_vace": "Wan blocks + VACE hint blocks",
    "wan_animate": "Wan blocks + pose, motion and face-adapter blocks",
    "ltx_video": "video RoPE table cut per rank (shard_output)",
    "ltx2": "audio + video streams with cross-modal attention",
    "mochi": "asymmetric dual stream, RoPE table cut per rank",
    "cosmos": "per-frame timesteps, AdaLN-LoRA",
    "krea2": "attention counting num_heads / num_kv_heads (GQA) with an output gate",
    "nucleusmoe": "routed experts as fused 3-D parameters (`experts` style), expert-choice routing",
}


def full_run() -> bool:
    """True when DTP_FULL=1: every case, not one per kind."""
    return os.environ.get("DTP_FULL") == "1"


def default_family(plan: str) -> bool:
    """Whether a family-wide module runs the family of bundled plan `plan` by default (it stands for a kind)."""
    return plan in KINDS


def default_slot(plan: str, slot: int, slots: int) -> bool:
    """Whether a kind's family runs by default in `slot` of `slots` settings of one mechanism (tp=2 or tp=4; a cp
    mesh and mode): the families of `KINDS` take the settings in turn, in `KINDS` order, so each kind runs once per
    mechanism and each setting runs about 1 / `slots` of the kinds. Every family in every slot with DTP_FULL=1."""
    if full_run():
        return True
    return plan in KINDS and list(KINDS).index(plan) % slots == slot


def family_runs(plan: str) -> bool:
    """Whether a spawned group computes `plan`'s family in this run: a kind's family, or every one with DTP_FULL=1."""
    return full_run() or default_family(plan)
