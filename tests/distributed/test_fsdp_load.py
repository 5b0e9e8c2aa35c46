"""Shard-on-load with fsdp=True on 4 gloo ranks: from_pretrained against diffusers' own load and FSDP2's own shards.

One process group. FLUX.1 and Wan (sharded QK-norm) tiny, saved by diffusers as one file and as many, loaded on
(cp=2, tp=2) and (cp=4) meshes with fsdp=True: the forward matches the unsharded model, every parameter's local
shard equals the one `dtp.parallelize(fsdp=True)` gives FSDP2 from the whole model (the loader's Layout math agrees
with FSDP2's sharding), and each rank reads at most 1.1x its share ((sharded / tp + replicated) / fsdp). By default
each mesh, model and layout once (`DEFAULT`); all 8 combinations with DTP_FULL=1.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.distributed.tensor import DTensor

import dtp
from dtp.loading.load import load
from dtp.testing.launch import spawn
from dtp.testing.scope import full_run
from dtp.testing.tiny import model_class, output_tensor, tiny_inputs, tiny_model

MODELS = ("FluxTransformer2DModel", "WanTransformer3DModel")
LAYOUTS = {"single": None, "multi": "40KB"}
MESHES = {"cp=2 x tp=2": dict(cp=2, tp=2), "cp=4": dict(cp=4)}
TOL = 1e-5  # max |out - ref| <= TOL * max |ref|
READ_SLACK = 1.1  # bytes read <= 1.1 x the share
# By default each mesh, model and layout once; the other 6 of the 8 combinations run with DTP_FULL=1.
DEFAULT = (("cp=2 x tp=2", "FluxTransformer2DModel", "single"), ("cp=4", "WanTransformer3DModel", "multi"))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp-load")
    dirs = {}
    for cls in MODELS:
        for layout, size in LAYOUTS.items():
            path = root / f"{cls}-{layout}"
            tiny_model(cls).save_pretrained(path, **({"max_shard_size": size} if size else {}))
            dirs[(cls, layout)] = str(path)
    return spawn(_worker, 4, dirs)


def _local(param) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


@torch.no_grad()
def _worker(rank, world, dirs):
    out = {}
    for tag, dims in MESHES.items():
        mesh = dtp.make_mesh(**dims)
        for (cls, layout), path in dirs.items():
            if not (full_run() or (tag, cls, layout) in DEFAULT):
                continue
            inputs = tiny_inputs(cls)
            reference = model_class(cls).from_pretrained(dirs[(cls, "single")]).eval()
            ref = output_tensor(reference(**inputs)).float()
            model, stats = load(model_class(cls), path, mesh, fsdp=True)
            fsdp = dtp.parallelize(model_class(cls).from_pretrained(path).eval(), mesh, fsdp=True)
            mine, theirs = dict(model.named_parameters()), dict(fsdp.named_parameters())
            unequal = [n for n in theirs if not torch.equal(_local(mine[n]), _local(theirs[n]))]
            result = output_tensor(model(**inputs)).float()
            out[(tag, cls, layout)] = dict(
                diff=float((result - ref).abs().max()),
                ref=float(ref.abs().max()),
                unequal=unequal,
                names_equal=sorted(mine) == sorted(theirs),
                read=stats.bytes_read,
                share=stats.share_bytes,
                whole=stats.sharded_bytes + stats.replicated_bytes,
            )
    return out


@pytest.mark.parametrize(
    "mesh, cls, layout",
    [
        pytest.param(*case, id="-".join(case), marks=() if case in DEFAULT else pytest.mark.full)
        for case in itertools.product(MESHES, MODELS, LAYOUTS)
    ],
)
def test_fsdp_load(results, mesh, cls, layout):
    """Parity <= 1e-5 x max |ref|; every local shard equals FSDP2's own; bytes read <= 1.1 x share < whole."""
    for rank, per_rank in enumerate(results):
        r = per_rank[(mesh, cls, layout)]
        assert r["diff"] <= TOL * r["ref"], (rank, r)
        assert r["names_equal"] and r["unequal"] == [], (rank, r["unequal"][:5])
        assert r["read"] <= READ_SLACK * r["share"] and r["share"] < r["whole"] / 2, (rank, r)
