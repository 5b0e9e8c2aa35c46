"""The plan fuzzer at depth: mutated bundled plans -> exact / refused / crashed / different, and the time per plan.

Every bundled DiT plan with a tiny config plus three text-encoder plans (T5, CLIP, Llama), each
mutated `--per-arch` times per (tp, pad) from a fixed seed (1-3 edits: a style changed, a rule
dropped, a rule added on another Linear, an attention glob dropped, packed blocks changed; see
`dtp/testing/fuzz.py`). `prepare` judges every mutant on a fake process group in this process; the
accepted ones run sharded on a gloo group of tp processes against the whole model. The promise: 0
crashed, 0 different.

    nice python benchmarks/plan_fuzz.py --per-arch 12 --tps 2 4 --fresh   # writes benchmarks/results/plan_fuzz.md

Each run keeps its rows in `results/plan_fuzz.json` and reports all rows kept: `--archs a b` reruns those plans
only (their rows replace the older ones), `--fresh` starts over.
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
ROWS = RESULTS.with_suffix(".json")  # every mutant's verdict, so that runs over some plans (`--archs`) add up
BATCH = 40  # accepted mutants per gloo group
DETAIL = 120  # characters of a refusal kept in ROWS (a crash or difference is kept whole)


def judge(archs, per_arch: int, tps, seed: int):
    """(mutant, verdict, detail, seconds in prepare) for every mutant; the accepted ones run on gloo afterwards."""
    rows, accepted = [], collections.defaultdict(list)
    for tp in tps:
        with fake_world(tp):
            mesh = make_mesh(tp=tp, device_type="cpu")
            for arch in archs:
                model = fuzz.make_model(arch)
                for mutant in fuzz.mutants(arch, 2 * per_arch, seed, tps=(tp,)):
                    start = time.perf_counter()
                    verdict, detail = fuzz.check_prepare(mutant, model, mesh)
                    rows.append([mutant, verdict, detail, time.perf_counter() - start])
                    if verdict == "accepted":
                        accepted[tp].append(len(rows) - 1)
                print(
                    f"tp={tp} {arch}: {collections.Counter(r[1] for r in rows if r[0].arch == arch and r[0].tp == tp)}"
                )
    for tp, indices in accepted.items():
        for i in range(0, len(indices), BATCH):
            run_batch(rows, indices[i : i + BATCH], tp)
    return rows


def run_batch(rows, batch: list[int], tp: int) -> None:
    """The gloo parity of `rows[batch]`; when the group fails (a rank died or hung), each mutant alone."""
    start = time.perf_counter()
    try:
        verdicts = spawn(fuzz.parity_worker, tp, [rows[j][0] for j in batch], timeout_s=900)[0]
    except Exception as error:
        if len(batch) > 1:
            for j in batch:
                run_batch(rows, [j], tp)
            return
        verdicts = [("crashed", f"gloo group failed: {' '.join(str(error).split())[:300]}")]
    seconds = (time.perf_counter() - start) / len(batch)
    for j, (verdict, detail) in zip(batch, verdicts):
        rows[j][1:] = [verdict, detail, rows[j][3] + seconds]
    print(f"tp={tp}: gloo parity of {len(batch)} accepted mutants, {seconds:.2f} s each", flush=True)


def table(rows, archs, tps) -> list[str]:
    lines = [
        "| plan | tp | mutants | exact | refused | crashed | different | s / plan |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arch in archs:
        for tp in tps:
            mine = [r for r in rows if r["arch"] == arch and r["tp"] == tp]
            if not mine:
                continue
            counts = collections.Counter(r["verdict"] for r in mine)
            mean = sum(r["seconds"] for r in mine) / len(mine)
            lines.append(
                f"| {arch} | {tp} | {len(mine)} | {counts['exact']} | {counts['refused']} | {counts['crashed']} | "
                f"{counts['different']} | {mean:.2f} |"
            )
    return lines


def stored(rows, args, elapsed: float) -> dict:
    """The rows of every run so far (`ROWS`), this run's (arch, tp) rows replacing older ones: a deep run can be split
    into several (`--archs`), and the report covers them all."""
    old = json.loads(ROWS.read_text()) if ROWS.exists() else {"runs": [], "rows": []}
    fresh = [
        {"arch": m.arch, "tp": m.tp, "mutant": str(m), "verdict": v, "detail": _detail(v, d), "seconds": round(t, 3)}
        for m, v, d, t in rows
    ]
    ran = {(r["arch"], r["tp"]) for r in fresh}
    command = f"nice python benchmarks/plan_fuzz.py {' '.join(sys.argv[1:])}".strip()
    run = {"command": command, "mutants": len(fresh), "seconds": round(elapsed)}
    return {
        "runs": [*old["runs"], run],
        "rows": [r for r in old["rows"] if (r["arch"], r["tp"]) not in ran] + fresh,
    }


def _detail(verdict: str, detail: str) -> str:
    return detail[:DETAIL] if verdict == "refused" else detail


def dumps(data: dict) -> str:
    """ROWS' text: one line per run and per row."""
    lines = [json.dumps(item) for item in data["runs"]], [json.dumps(item) for item in data["rows"]]
    return '{"runs": [\n' + ",\n".join(lines[0]) + '\n], "rows": [\n' + ",\n".join(lines[1]) + "\n]}\n"


def report(data: dict, per_arch: int) -> str:
    rows = data["rows"]
    archs = [a for a in fuzz.architectures() if any(r["arch"] == a for r in rows)]
    tps = sorted({r["tp"] for r in rows})
    counts = collections.Counter(r["verdict"] for r in rows)
    total = sum(run["seconds"] for run in data["runs"])
    bad = [r for r in rows if r["verdict"] in ("crashed", "different")]
    lines = [
        "# Plan fuzzing: mutated bundled plans, refused or exact",
        "",
        f"{len(rows)} mutants of {len(archs)} plans ({per_arch} per plan, tp and pad setting; pad off and on, half "
        f"each), {total:.0f} s in all on a shared 2-core CPU ({total / len(rows):.2f} s per plan: `prepare` on a fake "
        f"process group for every mutant, plus a gloo forward at tp ranks against one process for the accepted ones). "
        f"Runs:",
        "",
        *[f"- `{run['command']}`: {run['mutants']} mutants, {run['seconds']} s" for run in data["runs"]],
        "",
        f"**Totals: {counts['exact']} exact, {counts['refused']} refused, {counts['crashed']} crashed, "
        f"{counts['different']} different.**",
        "",
        *table(rows, archs, tps),
        "",
    ]
    if bad:
        lines += ["## Crashed or different", ""]
        lines += [f"- {r['verdict']}: {r['mutant']} -> {r['detail'][:300]}" for r in bad]
        lines.append("")
    exact = [r for r in rows if r["verdict"] == "exact"]
    lines += ["## Accepted and exact (first 20)", ""] + [f"- {r['mutant']} ({r['detail']})" for r in exact[:20]] + [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-arch", type=int, default=12, help="mutants per plan, tp and pad setting")
    parser.add_argument("--tps", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--archs", nargs="+", default=list(fuzz.architectures()))
    parser.add_argument("--fresh", action="store_true", help="forget the rows of earlier runs")
    args = parser.parse_args()
    if args.fresh and ROWS.exists():
        ROWS.unlink()
    start = time.perf_counter()
    rows = judge(args.archs, args.per_arch, args.tps, args.seed)
    data = stored(rows, args, time.perf_counter() - start)
    RESULTS.parent.mkdir(exist_ok=True)
    ROWS.write_text(dumps(data))
    text = report(data, args.per_arch)
    print(text)
    RESULTS.write_text(text)


if __name__ == "__main__":
    main()
