"""How far dtp's cp=2 host time is from the floor of its own aten ops: dtp's CP attention against the bare op sequence.

    python benchmarks/host_floor.py                # tiny and full depth, FLUX.1 and Wan; writes results/host_floor.md
    python benchmarks/host_floor.py --repeats 41 --depth tiny   # one depth; prints, writes nothing

Issue 43 bounds one rank's forward at cp=2 (Ulysses, ring) to 1.15x the host time of diffusers' unsharded forward
(`benchmarks/host_overhead.py`). This script asks what part of dtp's excess is its Python and what part is the aten
ops a context-parallel attention cannot avoid. Per row, diffusers' model is timed against dtp's rank, and against
dtp's rank with `CpAttention.__call__` replaced by the bare op sequence of the same algorithm (`bare_ulysses`,
`bare_ring`: the same collectives and kernels in the same layouts, written inline: no argument checks, no mask or pad
handling, no dispatch through helpers), each in its own alternation (`two_way_ms`; thread CPU time, one pinned core,
one torch thread, fake process group, fp32, no grad). Everything else of the bare forward (hooks, splits, gathers,
scopes) is dtp's own.
The op columns count the aten ops of one forward (`TorchDispatchMode`): what the bare sequence issues is the floor
of a CP attention in eager PyTorch; each such op costs ~2-3 µs of host whatever the widths.
Depths: `tiny` (the families' TINY configs: 2 blocks a list) and `full` (tiny widths at the real depth: FLUX.1-dev's
19 double + 38 single blocks, Wan 2.1 14B's 40), where per-forward work (the input splits and the output gather)
weighs least and the per-attention cost sets the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from host_overhead import MODELS, deep_tiny, pin_one_core  # noqa: E402

import dtp  # noqa: E402
from dtp.analysis.fakepg import fake_world  # noqa: E402
from dtp.runtime.cp import attention as cp_attention  # noqa: E402
from dtp.testing.host import MESHES, DTensorOps, alternated_medians, tiny_inputs, tiny_model  # noqa: E402

RESULT = Path(__file__).parent / "results" / "host_floor.md"
FULL_DEPTH = {"FluxTransformer2DModel": 19, "WanTransformer3DModel": 40}  # double blocks (FLUX.1: 2x single)
_OPTIONS = dist.AllToAllOptions()
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _all_to_all(send: torch.Tensor, group, recv_splits=(), send_splits=()):
    out = torch.empty_like(send)
    return out, group.alltoall_base(out, send, list(recv_splits), list(send_splits), _OPTIONS)


def bare_ulysses(q, k, v, group, scale):
    """`ulysses_attention`'s ops at B = 1 on diffusers' native backend: q, k, v stacked into one all-to-all, SDPA on
    the received [1, H/cp, S, D] views, one all-to-all back, the heads laid out again."""
    b, s, h, d = q.shape
    cp = group.size()
    send = torch.stack((q, k, v), dim=2).view(b, s, 3, cp, h // cp, d).permute(3, 0, 1, 2, 4, 5).contiguous()
    recv, work = _all_to_all(send, group)
    work.wait()
    qh, kh, vh = recv.view(1, cp * s, 3, h // cp, d).permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(qh, kh, vh, scale=scale)
    send = out.view(b, h // cp, cp, s, d).permute(2, 0, 3, 1, 4).contiguous()
    recv, work = _all_to_all(send, group)
    work.wait()
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s, h, d)


def bare_ring(q, k, v, group, scale):
    """`ring_attention`'s ops at cp = 2 without a mask: K/V sent as one buffer while the local block runs in torch's
    CPU flash kernel, the received block next, the two merged by one sigmoid and one lerp."""
    d_k, d_v = k.shape[-1], v.shape[-1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qh = q.transpose(1, 2)
    kv = torch.cat([k, v], dim=-1)
    rank = group.rank()
    splits = [0, 0]
    splits[1 - rank] = kv.shape[0]
    received, work = _all_to_all(kv, group, splits, splits)
    kh, vh = kv.transpose(1, 2).split_with_sizes((d_k, d_v), dim=-1)
    out_a, lse_a = _FLASH(qh, kh, vh, scale=scale)[:2]
    work.wait()
    kh, vh = received.transpose(1, 2).split_with_sizes((d_k, d_v), dim=-1)
    out_b, lse_b = _FLASH(qh, kh, vh, scale=scale)[:2]
    return torch.lerp(out_b, out_a, torch.sigmoid(lse_a - lse_b).unsqueeze(-1)).transpose(1, 2)


@contextlib.contextmanager
def bare_attention(mode: str):
    """dtp's CP attention replaced by the bare sequence of `mode` for calls without a mask (all of these models')."""
    original = cp_attention.CpAttention.__call__
    bare = bare_ulysses if mode == "ulysses" else bare_ring

    def call(self, dispatch, args):
        if args.get("attn_mask") is not None or self.group.size() != 2 and mode == "ring":
            return original(self, dispatch, args)
        return bare(args["query"], args["key"], args["value"], self.group, args.get("scale"))

    cp_attention.CpAttention.__call__ = call
    try:
        yield
    finally:
        cp_attention.CpAttention.__call__ = original


def two_way_ms(reference, sharded, mode: str, inputs: dict, repeats: int, rounds: int = 3) -> list[float]:
    """Median thread CPU ms of diffusers' forward, dtp's, and dtp's with the bare attention: `rounds` times one
    alternation of diffusers' and dtp's forward, then one of diffusers' and the bare one (the patch is on for that
    whole alternation: diffusers' model never calls `CpAttention`). Each model is timed right after the other one,
    as `benchmarks/host_overhead.py` does: a forward that follows the same model's runs ~5-10 % faster (warm caches),
    so a three-way turn would time the bare forward warmer than dtp's."""
    times: list[list[float]] = [[], [], []]
    for _ in range(rounds):
        ref_s, dtp_s = alternated_medians(reference, sharded, inputs, repeats=repeats)
        with bare_attention(mode):
            ref_b, bare_s = alternated_medians(reference, sharded, inputs, repeats=repeats)
        times[0] += [ref_s, ref_b]
        times[1].append(dtp_s * (ref_b + ref_s) / (2 * ref_s))  # each side against its own alternation's diffusers
        times[2].append(bare_s * (ref_b + ref_s) / (2 * ref_b))
    return [statistics.median(t) * 1e3 for t in times]


def op_counts(reference, sharded, mode: str, inputs: dict) -> list[int]:
    """Aten ops of one forward of each of the three."""
    counts = []
    with torch.no_grad():
        for model, bare in ((reference, False), (sharded, False), (sharded, True)):
            with bare_attention(mode) if bare else contextlib.nullcontext(), DTensorOps() as ops:
                model(**inputs)
            counts.append(ops.total)
    return counts


def row(class_name: str, mesh, depth: str, repeats: int) -> dict:
    with fake_world(mesh.world):
        reference = tiny_model(class_name) if depth == "tiny" else deep_tiny(class_name, FULL_DEPTH[class_name])
        device_mesh = dtp.make_mesh(cp=mesh.cp, device_type="cpu")
        sharded = dtp.parallelize(copy.deepcopy(reference), device_mesh, cp_mode=mesh.cp_mode)
        inputs = tiny_inputs(class_name, mesh)
        ops = op_counts(reference, sharded, mesh.cp_mode, inputs)
        ms = two_way_ms(reference, sharded, mesh.cp_mode, inputs, repeats)
    model = class_name.replace("Transformer2DModel", "").replace("Transformer3DModel", "")
    return dict(model=model, mesh=mesh.name, depth=depth, ms=ms, ops=ops)


def table(rows: list[dict]) -> str:
    lines = [
        "| model | mesh | depth | diffusers ms | dtp ms | bare ms | dtp ratio | bare ratio | dtp over bare | "
        "aten ops: diffusers / dtp / bare |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ref, ours, bare = r["ms"]
        lines.append(
            f"| {r['model']} | {r['mesh']} | {r['depth']} | {ref:.2f} | {ours:.2f} | {bare:.2f} | {ours / ref:.3f}x | "
            f"{bare / ref:.3f}x | {ours / bare:.3f}x | {' / '.join(map(str, r['ops']))} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--depth", choices=("tiny", "full"), action="append")
    args = parser.parse_args(argv)
    core = pin_one_core()
    meshes = [m for m in MESHES if m.name in ("cp=2 ulysses", "cp=2 ring")]
    rows = []
    for depth in args.depth or ("tiny", "full"):
        for class_name in MODELS:
            for mesh in meshes:
                rows.append(row(class_name, mesh, depth, args.repeats))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    if not args.depth:
        RESULT.write_text(
            "# cp=2 host time against the floor of its aten ops\n\n"
            f"`python benchmarks/host_floor.py` (thread CPU time; per row 3 rounds of two alternations of "
            f"{args.repeats} calls after 3, diffusers' with dtp's and diffusers' with the bare one; pinned to core "
            f"{core}, 1 torch thread, fake process group, fp32, no grad; torch "
            f"{torch.__version__}). bare: dtp's rank with its CP attention replaced by the bare op sequence "
            f"(`bare_ulysses` / `bare_ring`); the rest of the forward is dtp's.\n\n{text}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
