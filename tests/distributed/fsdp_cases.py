"""Shared by the FSDP parity modules: tiny transformers sharded with fsdp=True, compared with one process.

The reference is diffusers' own model, unsharded, in the rank's process (same seed: same weights, same inputs).
Each rank returns, per (mesh, model): the max |out - ref| and max |ref|, its resident parameter numbers (local
FSDP shard of the TP slice) against the whole model's and its two largest blocks', whether any parameter met in the
forward was a DTensor, the FSDP units' count, and the parameters that break the rule on vectors (whole on every
rank, matrices FSDP2's: `dtp.testing.fsdp_rule`). The negative control makes each rank's shard of one block weight
its fsdp neighbour's (a shard from the wrong rank): the gathered weight has its rows out of order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from dtp.testing.fsdp_rule import rule_breaks
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

FLUX, FLUX2, QWEN = "FluxTransformer2DModel", "Flux2Transformer2DModel", "QwenImageTransformer2DModel"
WAN, HUNYUAN, LTX = "WanTransformer3DModel", "HunyuanVideoTransformer3DModel", "LTXVideoTransformer3DModel"
MODELS = (FLUX, FLUX2, QWEN, WAN, HUNYUAN, LTX)
MOE = "NucleusMoEImageTransformer2DModel"  # routed experts: cp refused, so fsdp runs over cfg
TOL = 1e-5  # max |out - ref| <= TOL * max |ref|; measured at most 4.7e-7 (FLUX.1, cp=2 and cp=2 x tp=2)


def tag(dims: dict) -> str:
    return " x ".join(f"{k}={v}" for k, v in dims.items())


def inputs_for(cls: str, dims: dict) -> dict:
    """Batch 2 on a cfg mesh (each cfg group runs one half: the doubled-batch path), else batch 1."""
    return tiny_inputs(cls, batch=2 if dims.get("cfg", 1) > 1 else 1)


def numel(model: nn.Module) -> int:
    """This rank's resident parameter elements (a DTensor counts as its local piece)."""
    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())


def largest_blocks(model: nn.Module, count: int = 2) -> int:
    """The elements of the `count` largest blocks (elements of the outermost ModuleLists), whole."""
    from dtp.runtime.fsdp import block_lists

    sizes = sorted((sum(p.numel() for p in b.parameters()) for _, blocks in block_lists(model) for b in blocks))
    return sum(sizes[-count:])


class DTensorSpy:
    """Forward pre-hooks on every module: did any module run with a DTensor parameter of its own?"""

    def __init__(self, model: nn.Module):
        self.seen: list[str] = []
        self.handles = [m.register_forward_pre_hook(self._hook(n)) for n, m in model.named_modules()]

    def _hook(self, name):
        def hook(module, args):
            if any(isinstance(p, DTensor) for p in module.parameters(recurse=False)):
                self.seen.append(name)

        return hook

    def close(self) -> list[str]:
        for handle in self.handles:
            handle.remove()
        return self.seen


def wrong_rank_shard(model: nn.Module, fsdp_mesh, pick=None) -> str:
    """Negative control: every rank's shard of one block weight becomes its fsdp neighbour's: the first block's first
    2-D weight, or the first block weight `pick(name, param)` accepts."""
    from dtp.runtime.fsdp import block_lists

    pick = pick or (lambda name, p: p.ndim == 2)
    blocks = [block for _, blocks in block_lists(model) for block in blocks]
    name, param = next(
        (n, p)
        for block in blocks
        for n, p in block.named_parameters()
        if pick(n, p) and p.shape[0] % fsdp_mesh.size() == 0
    )
    local = param.to_local()
    group = fsdp_mesh.get_group()
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, local.contiguous(), group=group)
    local.copy_(pieces[(dist.get_rank(group) + 1) % len(pieces)])
    return name


@torch.no_grad()
def parity(cls: str, mesh, dims: dict, *, cp_mode: str = "ulysses", broken=False, fsdp: bool = True) -> dict:
    import dtp
    from dtp.runtime.parallelism import Parallelism

    inputs = inputs_for(cls, dims)
    reference = tiny_model(cls)
    ref = output_tensor(reference(**inputs)).float()
    model = dtp.parallelize(tiny_model(cls), mesh, cp_mode=cp_mode, fsdp=fsdp)
    breaks = rule_breaks(model) if fsdp else []  # vectors whole, matrices FSDP2's (dtp.testing.fsdp_rule)
    if broken:  # True, or a `pick` for `wrong_rank_shard`
        wrong_rank_shard(model, Parallelism(mesh, fsdp=True).fsdp_mesh, None if broken is True else broken)
    spy = DTensorSpy(model)
    out = output_tensor(model(**inputs)).float()
    again = output_tensor(model(**inputs)).float()  # the units resharded after the first call gather again
    return dict(
        diff=float((out - ref).abs().max()),
        again=float((again - ref).abs().max()),
        ref=float(ref.abs().max()),
        shape_ok=out.shape == ref.shape,
        local=numel(model),
        whole=sum(p.numel() for p in reference.parameters()),
        blocks=largest_blocks(reference),
        dtensor_modules=spy.close(),
        rule_breaks=breaks,
    )


def rank_job(
    rank: int, world: int, runs: list[tuple[dict, tuple[str, ...]]], broken: tuple[dict, str], moe=None
) -> dict:
    """Each run's models on its mesh (`make_mesh` keywords), then on `broken`'s mesh: its model without fsdp, and the
    negative control; with `moe` (a mesh's keywords), `moe_job`'s two runs too."""
    import dtp

    out = {}
    for dims, models in runs:
        mesh = dtp.make_mesh(**dims)
        for cls in models:
            out[(tag(dims), cls)] = parity(cls, mesh, dims)
    dims, cls = broken
    out[("plain", cls)] = parity(cls, dtp.make_mesh(**dims), dims, fsdp=False)  # the same mesh without fsdp
    out[("broken", cls)] = parity(cls, dtp.make_mesh(**dims), dims, broken=True)
    if moe is not None:
        out.update({(key, MOE): r for key, r in moe_job(rank, world, moe).items()})
    return out


def experts(name: str, param) -> bool:
    """The fused 3-D expert weights of a mixture-of-experts block (NucleusMoE's `experts.gate_up_proj`)."""
    return param.ndim == 3 and "experts" in name


def moe_job(rank: int, world: int, dims: dict) -> dict:
    """NucleusMoE (the `experts` style) with fsdp on `dims`, and its control: an expert weight's shard from the wrong
    fsdp rank."""
    import dtp

    mesh = dtp.make_mesh(**dims)
    return {"moe": parity(MOE, mesh, dims), "broken": parity(MOE, mesh, dims, broken=experts)}


def check(results: list[dict], key, world: int, tp: int) -> None:
    """Parity on every rank; resident parameters <= 1.05 x whole / world + the two largest blocks / tp; every vector
    whole and every matrix FSDP2's (`rule_breaks`, read right after sharding)."""
    for rank, per_rank in enumerate(results):
        r = per_rank[key]
        assert r["shape_ok"], (rank, key)
        assert r["diff"] <= TOL * r["ref"] and r["again"] <= TOL * r["ref"], (rank, key, r)
        assert r["local"] <= 1.05 * r["whole"] / world + r["blocks"] / tp, (rank, key, r)
        assert r["rule_breaks"] == [], (rank, key, r["rule_breaks"][:3])
        if tp == 1:
            assert r["dtensor_modules"] == [], (rank, key, r["dtensor_modules"][:5])


TWO_DOUBLE = dict(num_layers=2, num_single_layers=1)  # the first block runs while the second, as large, is gathered


@torch.no_grad()
def in_flight(mesh, unit=True) -> dict:
    """One forward's peak above the weights at rest (torch's MemTracker), without fsdp (key False) and with `fsdp=unit`
    (key True), on tiny FLUX.1 with 2 double blocks; "in_flight": the bytes the code (and `dtp fit`) count for the
    fsdp layout (the running unit and its window); "largest" / "root": the largest block's and the root's bytes."""
    from torch.distributed._tools.mem_tracker import MemTracker

    import dtp
    from dtp.runtime.fsdp import block_lists, in_flight_bytes
    from dtp.runtime.memory import local_param_bytes

    inputs, out = tiny_inputs(FLUX), {}
    for fsdp in (False, unit):
        model = dtp.parallelize(tiny_model(FLUX, **TWO_DOUBLE), mesh, fsdp=fsdp)
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            model(**inputs)
        peak = max(stats["Total"] for stats in tracker.get_tracker_snapshot("peak").values())
        out[bool(fsdp)] = peak - local_param_bytes(model)  # what the forward adds to the weights at rest
    out["in_flight"] = in_flight_bytes(model)
    whole = tiny_model(FLUX, **TWO_DOUBLE)
    blocks = [local_param_bytes(b) for _, lst in block_lists(whole) for b in lst]
    out["largest"], out["root"] = max(blocks), local_param_bytes(whole) - sum(blocks)
    return out
