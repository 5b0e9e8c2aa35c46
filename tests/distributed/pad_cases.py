"""Worker side of the padding parity tests (pad=True): tiny models whose head counts tp does not divide."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

import dtp
from dtp.loading.load import load
from dtp.styles import full_tensor
from dtp.testing.parity import forward_parity
from dtp.testing.tiny import model_class, output_tensor, tiny_inputs, tiny_model

ZIMAGE, FLUX, QWEN = "ZImageTransformer2DModel", "FluxTransformer2DModel", "QwenImageTransformer2DModel"
# Z-Image 6B's 30 heads with a small head width; FLUX.1 and Qwen-Image with 6 heads of 16.
PADDED = {
    "zimage30": (ZIMAGE, "zimage", dict(dim=240, n_heads=30, n_kv_heads=30, axes_dims=[4, 2, 2])),
    "flux6": (FLUX, "flux", dict(num_attention_heads=6)),
    "qwen6": (QWEN, "qwenimage", dict(num_attention_heads=6)),
}
BATCH = 2


def make(name: str):
    cls, _, overrides = PADDED[name]
    return partial(tiny_model, cls, **overrides)


def inputs(name: str) -> dict:
    cls = PADDED[name][0]
    result = tiny_inputs(cls, batch=BATCH)
    if cls == ZIMAGE:
        # Captions of different lengths: the refiners and main layers then run with a real key mask.
        result["cap_feats"][1] = result["cap_feats"][1][:5]
    return result


def save_checkpoints(root) -> dict:
    """Each padded tiny model saved by diffusers (safetensors), for shard-on-load."""
    dirs = {}
    for name in PADDED:
        path = root / name
        make(name)().save_pretrained(path, safe_serialization=True)
        dirs[name] = str(path)
    return dirs


@torch.no_grad()
def run_cases(rank, world_size, dirs):
    tp4 = dtp.make_mesh(tp=4, cp=1, device_type="cpu")
    cp2tp2 = dtp.make_mesh(tp=2, cp=2, device_type="cpu")
    results = {}
    for name, (_, plan_name, _) in PADDED.items():
        plan = dtp.load_plan(plan_name)
        results[f"{name}/tp4"] = forward_parity(make(name), inputs(name), tp4, plan, pad=True).relative
        results[f"{name}/load_tp4"] = load_parity(name, dirs[name], tp4)
    # Ulysses: 6 heads at tp=2 would leave 3 per rank, which cp=2 does not divide; padded to 8: 4, then 2.
    results["flux6/cp2tp2"] = forward_parity(make("flux6"), inputs("flux6"), cp2tp2, dtp.load_plan("flux"), pad=True)
    results["flux6/cp2tp2"] = results["flux6/cp2tp2"].relative
    results["gqa/tp4"] = forward_parity(GqaModel, gqa_inputs(), tp4, dtp.Plan.from_dict(GQA_PLAN), pad=True).relative
    results.update(layout_facts())
    results["zimage30/nonzero_padding"] = nonzero_padding(tp4)
    return results


@torch.no_grad()
def load_parity(name: str, path: str, mesh) -> dict:
    """Shard-on-load with pad=True against diffusers' own unsharded load of the same folder."""
    cls = model_class(PADDED[name][0])
    reference = output_tensor(cls.from_pretrained(path).eval()(**inputs(name))).float()
    model, stats = load(cls, path, mesh, dtp.load_plan(PADDED[name][1]), pad=True)
    out = output_tensor(model(**inputs(name))).float()
    return dict(
        relative=float((out - reference).abs().max() / reference.abs().max()),
        bytes_read=stats.bytes_read,
        sharded=stats.sharded_bytes,
        replicated=stats.replicated_bytes,
    )


def layout_facts() -> dict:
    """Z-Image, 30 heads of 8 at tp=4: 32 padded heads, 8 per rank; gathering a padded weight gives the original."""
    mesh = dtp.make_mesh(tp=4, cp=1, device_type="cpu")
    original = make("zimage30")().layers[0].attention
    attn = dtp.parallelize(make("zimage30")(), mesh, dtp.load_plan("zimage"), pad=True).layers[0].attention
    return {
        "zimage30/local": dict(heads=attn.heads, inner_dim=attn.inner_dim, q_rows=attn.to_q.weight.to_local().shape[0]),
        "zimage30/reassembly": all(
            torch.equal(full_tensor(getattr(attn, n).weight), getattr(original, n).weight) for n in ("to_q", "to_v")
        )
        and torch.equal(full_tensor(attn.to_out[0].weight), original.to_out[0].weight),
    }


@torch.no_grad()
def nonzero_padding(mesh) -> float:
    """Negative control: the padded heads' v rows and out-projection columns set to 1 on the last rank: wrong."""
    ref = output_tensor(make("zimage30")()(**inputs("zimage30"))).float()
    model = dtp.parallelize(make("zimage30")(), mesh, dtp.load_plan("zimage"), pad=True)
    if mesh["tp"].get_local_rank() == 3:  # rank 3 holds heads 24..29 and the two zero heads 30, 31
        for block in model.layers:
            attn, pad_rows = block.attention, slice(6 * 8, 8 * 8)
            attn.to_v.weight.to_local()[pad_rows] = 1.0
            attn.to_out[0].weight.to_local()[:, pad_rows] = 1.0
    out = output_tensor(model(**inputs("zimage30"))).float()
    return float((out - ref).abs().max() / ref.abs().max())


class GqaAttention(nn.Module):
    """diffusers-style GQA attention: 6 query heads share 2 kv heads (3 each), per-head QK RMSNorm, RoPE-free."""

    def __init__(self, dim=24, heads=6, kv_heads=2, head_dim=4):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.to_q = nn.Linear(dim, heads * head_dim)
        self.to_k = nn.Linear(dim, kv_heads * head_dim)
        self.to_v = nn.Linear(dim, kv_heads * head_dim)
        self.norm_q = nn.RMSNorm(head_dim, eps=1e-6)
        self.norm_k = nn.RMSNorm(head_dim, eps=1e-6)
        self.to_out = nn.ModuleList([nn.Linear(heads * head_dim, dim)])

    def forward(self, x, mask):
        q = self.norm_q(self.to_q(x).unflatten(-1, (self.heads, -1))).transpose(1, 2)
        k = self.norm_k(self.to_k(x).unflatten(-1, (self.kv_heads, -1))).transpose(1, 2)
        v = self.to_v(x).unflatten(-1, (self.kv_heads, -1)).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], enable_gqa=True)
        return self.to_out[0](out.transpose(1, 2).flatten(2))


class GqaModel(nn.Module):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__()
        self.blocks = nn.ModuleList([GqaAttention(), GqaAttention()])

    def forward(self, x, mask):
        for block in self.blocks:
            x = x + block(x, mask)
        return x


GQA_PLAN = {
    "blocks.*.to_q": "colwise",
    "blocks.*.to_k": "colwise",
    "blocks.*.to_v": "colwise",
    "blocks.*.to_out.0": "rowwise",
}


def gqa_inputs() -> dict:
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(BATCH, 10, dtype=torch.bool)
    mask[1, 7:] = False  # the second sample's last 3 keys are masked out
    return dict(x=torch.randn(BATCH, 10, 24, generator=g), mask=mask)
