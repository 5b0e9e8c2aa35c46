"""The plan fuzzer at depth: mutated bundled plans -> exact / refused / over-refused / wrong / crash.

Every bundled DiT plan with a tiny config plus three text-encoder plans (T5, CLIP, Llama), each mutated
`--per-mesh` times on every 4-rank mesh it takes (`fuzz.meshes`: (tp=2, cp=2) with its bundled cp section,
and (tp=4, cp=1)) from a fixed seed, pad cycled (1-3 edits; see `dtp/testing/fuzz.py`); batch 2 with masks.
`prepare` judges every mutant on a fake process group in this process; the accepted ones run sharded on a
gloo group of 4 processes against the whole model. A refused mutant that `prepare` accepts with the engine's
exactness checks switched off runs the same way: exact there means the refusal was not needed.

    exact         accepted, and the sharded forward within 1e-5 of one process
    refused       PlanError, and needed (with the exactness checks off it is still refused, differs or crashes)
    over-refused  PlanError, but with the exactness checks off it runs exactly (a cost, not a wrong answer)
    wrong         accepted, and the forward differs                                  (the promise: 0)
    crash         prepare or the accepted forward raised something else than PlanError (the promise: 0)

    nice python benchmarks/plan_fuzz.py --per-mesh 50    # writes benchmarks/results/plan_fuzz.{md,json}
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

from dtp.analysis.fakepg import fake_world
from dtp.runtime.mesh import make_mesh
from dtp.testing import fuzz
from dtp.testing.launch import spawn

RESULTS = Path(__file__).resolve().parent / "results" / "plan_fuzz.md"
WORLD = 4
BATCH = 40  # mutants per gloo group
VERDICTS = ("exact", "refused", "over-refused", "wrong", "crash")


def judge_locally(archs, per_mesh: int, seed: int) -> list[dict]:
    """Every mutant with its `prepare` verdict, and for refused ones whether it passes with the checks off."""
    rows = []
    with fake_world(WORLD):
        meshes = {m: make_mesh(tp=m[0], cp=m[1], device_type="cpu") for m in ((2, 2), (4, 1))}
        for arch in archs:
            model = fuzz.make_model(arch)
            for tp, cp in fuzz.meshes(arch):
                for mutant in fuzz.mutants(arch, per_mesh, seed, tps=(tp,), cp=cp):
                    verdict, detail = fuzz.check_prepare(mutant, model, meshes[(tp, cp)])
                    row = dict(mutant=mutant, prepare=verdict, detail=detail, unchecked=None)
                    if verdict == "refused":
                        with fuzz.exactness_checks_off():
                            row["unchecked"] = fuzz.check_prepare(mutant, model, meshes[(tp, cp)])[0]
                    rows.append(row)
            print(f"{arch}: {collections.Counter(r['prepare'] for r in rows if r['mutant'].arch == arch)}", flush=True)
    return rows


def run_on_gloo(rows: list[dict], worker, key: str) -> None:
    """`worker` over `rows` (grouped by mesh, BATCH at a time); its verdict stored under `key`."""
    by_mesh = collections.defaultdict(list)
    for row in rows:
        by_mesh[(row["mutant"].tp, row["mutant"].cp)].append(row)
    for batch_rows in by_mesh.values():
        for i in range(0, len(batch_rows), BATCH):
            _run_batch(batch_rows[i : i + BATCH], worker, key)


def _run_batch(batch: list[dict], worker, key: str) -> None:
    """One gloo group for the batch; when it fails (a rank died or hung), each mutant alone."""
    try:
        verdicts = spawn(worker, WORLD, [r["mutant"] for r in batch], timeout_s=300)[0]
    except Exception as error:
        if len(batch) > 1:
            for row in batch:
                _run_batch([row], worker, key)
            return
        verdicts = [("crashed", f"gloo group failed: {' '.join(str(error).split())[:300]}")]
    for row, verdict in zip(batch, verdicts):
        row[key] = verdict
    print(f"{worker.__name__}: {len(batch)} mutants", flush=True)


def final(row: dict) -> str:
    if row["prepare"] == "crashed":
        return "crash"
    if row["prepare"] == "accepted":
        return {"exact": "exact", "different": "wrong", "refused": "refused"}.get(row["parity"][0], "crash")
    return "over-refused" if row.get("overrefusal", ("",))[0] == "exact" else "refused"


def table(rows: list[dict]) -> list[str]:
    lines = ["| plan | (tp, cp) | mutants | " + " | ".join(VERDICTS) + " |", "|---|---|" + "---:|" * 6]
    groups = collections.defaultdict(list)
    for row in rows:
        groups[(row["mutant"].arch, (row["mutant"].tp, row["mutant"].cp))].append(row)
    for (arch, mesh), mine in groups.items():
        counts = collections.Counter(r["verdict"] for r in mine)
        lines.append(f"| {arch} | {mesh} | {len(mine)} | " + " | ".join(str(counts[v]) for v in VERDICTS) + " |")
    return lines


def report(rows: list[dict], seconds: float, command: str) -> str:
    counts = collections.Counter(r["verdict"] for r in rows)
    bad = [r for r in rows if r["verdict"] in ("wrong", "crash")]
    over = [r for r in rows if r["verdict"] == "over-refused"]
    lines = [
        "# Plan fuzzing: mutated bundled plans, refused or exact",
        "",
        f"`{command}`: {len(rows)} mutants of {len({r['mutant'].arch for r in rows})} plans in {seconds:.0f} s on a "
        "shared 2-core CPU.",
        "",
        "**Totals: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + ".**",
        "",
        *table(rows),
        "",
    ]
    if bad:
        lines += ["## Wrong or crash", ""] + [f"- {r['verdict']}: {r['mutant']} -> {_why(r)[:300]}" for r in bad] + [""]
    lines += ["## Over-refused (first 20)", ""] + [f"- {r['mutant']}: {r['detail'][:160]}" for r in over[:20]] + [""]
    return "\n".join(lines)


def _why(row: dict) -> str:
    return row["detail"] if row["prepare"] == "crashed" else row["parity"][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-mesh", type=int, default=50, help="mutants per plan and mesh")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--archs", nargs="+", default=list(fuzz.architectures()))
    parser.add_argument("--results", type=Path, default=RESULTS, help="the .md to write (and a .json beside it)")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = judge_locally(args.archs, args.per_mesh, args.seed)
    run_on_gloo([r for r in rows if r["prepare"] == "accepted"], fuzz.parity_worker, "parity")
    run_on_gloo([r for r in rows if r["unchecked"] == "accepted"], fuzz.overrefusal_worker, "overrefusal")
    for row in rows:
        row["verdict"] = final(row)
    command = f"nice python benchmarks/plan_fuzz.py {' '.join(sys.argv[1:])}".strip()
    text = report(rows, time.perf_counter() - start, command)
    print(text)
    args.results.parent.mkdir(exist_ok=True)
    args.results.write_text(text)
    kept = [json.dumps({"mutant": str(r["mutant"]), "verdict": r["verdict"], "detail": _detail(r)}) for r in rows]
    header = json.dumps(command)
    args.results.with_suffix(".json").write_text(f'{{"command": {header}, "rows": [\n' + ",\n".join(kept) + "\n]}\n")


def _detail(row: dict) -> str:
    found = row.get("parity") or row.get("overrefusal")
    return (found[1] if found else row["detail"])[: 300 if row["verdict"] in ("wrong", "crash") else 120]


if __name__ == "__main__":
    main()
