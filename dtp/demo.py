"""`dtp demo`: a tiny random FLUX transformer sharded over N local processes against 1.

Prints the max difference of the outputs and each rank's parameter bytes; exits non-zero when the
sharded output is off by more than the tolerance.
"""

from __future__ import annotations

from functools import partial

import torch

TOLERANCE = 1e-5  # max |sharded - ref| <= TOLERANCE * max |ref|, fp32
CLASS_NAME = "FluxTransformer2DModel"


def register(sub) -> None:
    p = sub.add_parser("demo", help="shard a tiny random FLUX transformer over local processes and compare")
    p.add_argument("--nproc", type=int, default=2, help="number of local processes = TP degree (default 2)")
    p.add_argument("--plan", default="flux", help="bundled plan name or YAML path (default flux)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .launch import spawn

    sharded = spawn(_rank_job, args.nproc, args.plan)
    single = spawn(_rank_job, 1, args.plan)[0]
    rel = float((sharded[0]["out"] - single["out"]).abs().max() / single["out"].abs().max())
    print(f"dtp demo: tiny {CLASS_NAME}, plan '{args.plan}', tp={args.nproc} vs tp=1 (gloo on CPU)")
    print(f"{'rank':>6} {'param bytes':>14} {'share of tp=1':>14}")
    for rank, result in enumerate(sharded):
        print(f"{rank:>6} {result['bytes']:>14,} {result['bytes'] / single['bytes']:>14.3f}")
    print(f"{'tp=1':>6} {single['bytes']:>14,} {1.0:>14.3f}")
    ok = rel <= TOLERANCE
    print(f"max |sharded - single| / max |single| = {rel:.2e} (tolerance {TOLERANCE:.0e}): {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def _rank_job(rank: int, world_size: int, plan_name: str) -> dict:
    import dtp
    from .memory import local_param_bytes
    from .tiny import output_tensor, tiny_inputs, tiny_model

    mesh = dtp.make_mesh(tp=world_size)
    model = dtp.parallelize(tiny_model(CLASS_NAME), mesh, dtp.load_plan(plan_name))
    with torch.no_grad():
        out = output_tensor(model(**tiny_inputs(CLASS_NAME))).float()
    return {"out": out, "bytes": local_param_bytes(model)}
