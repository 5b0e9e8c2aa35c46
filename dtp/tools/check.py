"""`dtp check MODEL_OR_PLAN --tp N`: the command line of `dtp.analysis.check` (runs it, prints the report)."""

from __future__ import annotations

import json
import sys

from ..analysis.check import add_cfg, check, check_fsdp, check_pipeline, is_pipeline_target
from ..analysis.fsdp import fsdp_pipeline_bytes
from ..analysis.kernels import format_kernels
from ..analysis.lint import format_lint
from ..analysis.released import RELEASED_PIPELINES
from ..errors import PlanError


def run(args) -> int:
    try:
        report = _pipeline_or_model(args)
        add_fsdp(report, args)
    except PlanError as exc:
        message = str(exc) if str(exc).startswith("dtp check:") else f"dtp check: {exc}"
        print(json.dumps({"error": str(exc)}) if args.json else message, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_pipeline_report(report) if "pipeline" in report else format_report(report))
    return 0


def _pipeline_or_model(args) -> dict:
    if is_pipeline_target(args.target):
        if args.plan or args.config:
            raise PlanError(f"--plan and --config apply to one model, not to '{args.target}'.")
        if args.kernels:
            raise PlanError(f"--kernels traces one model's forward, not '{args.target}': name its transformer.")
        report = check_pipeline(
            args.target,
            tp=args.tp,
            cp=args.cp,
            cp_mode=args.cp_mode,
            dtype=args.dtype,
            pad=args.pad,
            whole_text_encoders=args.whole_text_encoders,
            ulysses=args.ulysses,
        )
        if not (args.fsdp and args.cfg > 1):  # with --fsdp, --cfg is an axis the weights are divided over
            add_cfg(report, args.cfg)  # refuses cfg > 1: the exchange needs one model's measured output
        return report
    if args.whole_text_encoders:
        raise PlanError(f"--whole-text-encoders applies to a pipeline ({', '.join(RELEASED_PIPELINES)}).")
    return check(
        args.target,
        tp=args.tp,
        cp=args.cp,
        cp_mode=args.cp_mode,
        plan=args.plan,
        config=args.config,
        dtype=args.dtype,
        resolution=args.resolution,
        frames=args.frames,
        text_tokens=args.text_tokens,
        forward=args.forward,
        pad=args.pad,
        quant=args.quant,
        cfg=args.cfg,
        peak=args.peak,
        kernels=args.kernels,
        attention=args.attention_backend,
        ulysses=args.ulysses,
    )


def add_fsdp(report: dict, args) -> None:
    """`--fsdp`: PlanError without a non-tp axis > 1 or with --quant (as `dtp.prepare` refuses them); else each
    rank's parameter bytes between calls with FSDP2 dividing the blocks over the cfg x cp ranks
    (`fsdp_per_rank_bytes`, traced: `analysis/fsdp.py`; the figure `dtp fit`'s fsdp rows use; before the first call
    `fsdp_sharded_bytes`; the whole blocks gathered in flight come on top: `dtp fit` models them)."""
    if not getattr(args, "fsdp", False):
        return
    ranks = args.cfg * args.cp
    if ranks == 1:
        raise PlanError(
            "dtp check: --fsdp shards weights over the non-tp axes (cfg x cp), but --cp 1 --cfg 1 has none larger "
            "than 1; pass --cp 2 (or --cfg 2), or drop --fsdp."
        )
    if getattr(args, "quant", None):
        raise PlanError("dtp check: --fsdp with --quant: torchao's quantized weights cannot be gathered by FSDP2.")
    report["fsdp"] = ranks
    options = dict(tp=args.tp, cp=args.cp, cp_mode=args.cp_mode, dtype=args.dtype, pad=args.pad)
    if "pipeline" in report:  # traced: each planned component sharded with fsdp=True on a fake world
        planned = {c["name"] for c in report["components"] if c["plan"]}
        traced = fsdp_pipeline_bytes(args.target, planned, cfg=args.cfg, fsdp=args.fsdp, **options)
        report["fsdp_cfg"] = args.cfg
        for c in report["components"]:
            f = traced.get(c["name"])
            c["fsdp_per_rank_bytes"] = c["per_rank_bytes"] if f is None else f.resident
            c["fsdp_in_flight_bytes"] = 0 if f is None else f.in_flight
    else:  # traced: the model sharded with fsdp=True on a fake world (analysis/fsdp.py)
        report.update(
            check_fsdp(args.target, plan=args.plan, config=args.config, cfg=args.cfg, fsdp=args.fsdp, **options)
        )


def _fsdp_lines(r: dict) -> list[str]:
    if "fsdp" not in r:
        return []
    return [
        f"  with --fsdp (resident){'':10} {_gb(r['fsdp_per_rank_bytes'])}  (blocks over {r['fsdp']} cfg x cp ranks, "
        f"root gathered after the first call, vectors whole; before it {_gb(r['fsdp_sharded_bytes']).strip()})",
        f"  with --fsdp (in flight){'':9} {_gb(r['fsdp_in_flight_bytes'])}  (on top while the blocks run: the running "
        "unit and its prefetch window, runtime/fsdp.py)",
    ]


def _axis_line(r: dict) -> str:
    """What the figures above are per, along cp: replicated weights, or FSDP dividing them."""
    if "fsdp" in r:
        return (
            f"cp={r['cp']}: with --fsdp, FSDP2 divides the weights over the {r['fsdp']} cfg x cp ranks as well and "
            "gathers each unit just before it runs; 'per-rank bytes' is without it."
        )
    return f"cp={r['cp']}: weights are replicated along cp, so the memory figures are per tp group."


def _cp_label(r: dict) -> str:
    """ "ulysses", "ring", or USP's "ulysses 2 x ring 2"."""
    ulysses, ring = r.get("ulysses"), r.get("ring")
    return f"ulysses {ulysses} x ring {ring}" if ulysses and ring and ulysses > 1 and ring > 1 else r["cp_mode"]


def format_report(r: dict) -> str:
    lines = [
        f"dtp check: {r['model']}, plan {r['plan']}, tp={r['tp']} cp={r['cp']} "
        f"(meta device, fake process group of {r['world_size']} ranks)",
        f"config: {r['config']}; parameters in {r['dtype']}"
        + (f", every Linear quantized {r['quant']} (data + scales)" if r.get("quant") else ""),
        f"  total parameters     {r['params'] / 1e9:10.3f} B  {_gb(r['total_bytes'])}",
        f"  per-rank bytes       {'':12} {_gb(r['per_rank_bytes'])}",
        *_fsdp_lines(r),
        f"  ideal total/tp       {'':12} {_gb(r['ideal_bytes'])}",
        f"  ratio per-rank/ideal {r['ratio']:10.3f}",
        f"  supported tp         {_degrees(r['candidates'])}"
        + (f" (with cp={r['cp']}, {_cp_label(r)})" if r["cp"] > 1 else "")
        + (" (pad=True)" if r["pad"] else ""),
    ]
    if r.get("padding"):
        lines += _format_padding(r["padding"])
    lines += ["largest replicated modules (held whole by every rank):"]
    lines += [f"  {m['module']:<52} x{m['count']:<3} {_gb(m['bytes'])}" for m in r["replicated"]]
    if "collectives" in r:
        lines += _format_collectives(r["collectives"])
    if "cfg_exchange" in r:
        lines += _format_cfg(r["cfg"], r["cfg_exchange"])
    if "activation_peak" in r:
        lines += format_peak(r["activation_peak"], r["dtype"])
    if "kernels" in r:
        k = r["kernels"]
        lines += [f"kernels: not traced ({k['error']})"] if "error" in k else format_kernels(k)
    if "lint" in r:
        lines += format_lint(r["lint"])
    if r["cp"] > 1:
        lines.append(_axis_line(r))
    return "\n".join(lines)


def format_pipeline_report(r: dict) -> str:
    lines = [
        f"dtp check: {r['pipeline']} ({r['title']}, released configs), tp={r['tp']} cp={r['cp']} "
        f"(meta device, fake process group of {r['world_size']} ranks)",
        f"parameters in {r['dtype']}" + (", pad=True" if r["pad"] else "") + "; every component of the pipeline:",
        f"  {'component':<16} {'class':<36} {'plan':<10} {'whole':>13} {'per rank':>13}",
    ]
    for c in r["components"]:
        lines.append(
            f"  {c['name']:<16} {c['class']:<36} {c['plan'] or 'whole':<10} "
            f"{_gb(c['total_bytes'])} {_gb(c['per_rank_bytes'])}"
        )
    params = f"{r['params'] / 1e9:.3f} B parameters"
    lines += [
        f"  {'total':<16} {params:<36} {'':<10} {_gb(r['total_bytes'])} {_gb(r['per_rank_bytes'])}",
        f"  ideal total/tp       {'':12} {_gb(r['ideal_bytes'])}",
        f"  ratio per-rank/ideal {r['ratio']:10.3f}",
    ]
    if "fsdp" in r:  # traced: analysis/fsdp.fsdp_pipeline_bytes
        fsdp = sum(c["fsdp_per_rank_bytes"] for c in r["components"])
        in_flight = max(c["fsdp_in_flight_bytes"] for c in r["components"])  # the components run one at a time
        ranks = f"cfg={r['fsdp_cfg']} x cp={r['cp']}" if r["fsdp_cfg"] > 1 else f"cp={r['cp']}"
        lines += [
            f"  with --fsdp (resident){'':10} {_gb(fsdp)}  (planned components over the {r['fsdp']} {ranks} ranks)",
            f"  with --fsdp (in flight){'':9} {_gb(in_flight)}  (the largest component's running unit and window)",
        ]
        if r["fsdp_cfg"] > 1:
            lines.append(f"  (the cfg={r['fsdp_cfg']} exchange per step: `dtp check <model> --cfg {r['fsdp_cfg']}`)")
    whole = [f"  {c['name']}: {c['whole_reason']}" for c in r["components"] if c["plan"] is None]
    lines += ["held whole by every rank:", *whole] if whole else []
    return "\n".join(lines)


def format_peak(p: dict, dtype: str) -> list[str]:
    """The activation-peak lines of the `dtp check` table."""
    if "error" in p:
        return [f"activation peak of one forward: not measured ({p['error']})"]
    mode = f" {p['cp_mode']}" if p["cp"] > 1 else ""
    rows = (
        ("one rank (cp=1, tp=1)", _gb(p["one_rank_bytes"])),
        (f"per rank (cp={p['cp']}, tp={p['tp']}{mode})", _gb(p["per_rank_bytes"])),
        (f"ideal one rank / {p['cp'] * p['tp']}", _gb(p["ideal_bytes"])),
        ("ratio per-rank/ideal", f"{p['ratio']:10.3f}"),
    )
    head = f"activation peak of one forward (batch 1, {dtype}, fake tensors, the whole model): {p['input']}"
    guessed = p.get("guessed", 0)
    note = [f"  ({guessed} data-dependent values guessed: tests as False, masks selecting all)"] if guessed else []
    return [head] + [f"  {label:<32} {value}" for label, value in rows] + _format_whole(p.get("whole")) + note


def _format_whole(whole: dict | None) -> list[str]:
    """The tensors held whole at the per-rank peak (`analysis/whole.py`): the region's cost above ideal."""
    if not whole or not whole["tensors"]:
        return []
    lines = [f"  held whole by every rank at the peak ({whole['count']}; bytes, above ideal, made by):"]
    for row in whole["tensors"]:
        tensor, made_by = row["tensor"], row["made_by"]
        lines.append(f"    {_gb(row['bytes'])} {_gb(row['above_ideal_bytes'])}  {tensor:<28} {made_by}")
    lines.append(f"  {'whole tensors above ideal':<32} {_gb(whole['above_ideal_bytes'])}")
    lines.append(f"  {'ratio without them':<32} {whole['ratio_without']:10.3f}")
    return lines


def _degrees(degrees: list[int]) -> str:
    """`1, 2, 5, 10`; a run of consecutive degrees as `1-30` (pad=True lists every degree)."""
    if len(degrees) > 3 and degrees == list(range(degrees[0], degrees[-1] + 1)):
        return f"{degrees[0]}-{degrees[-1]}"
    return ", ".join(map(str, degrees))


def _format_padding(p: dict) -> list[str]:
    return [
        f"padding (zero heads/widths; heads {', '.join(p['heads']) or 'unchanged'}):",
        f"  padded parameters    {p['padded_params'] / 1e6:10.3f} M  {_gb(p['padded_bytes'])} "
        f"(per rank {_gb(p['padded_bytes_per_rank']).strip()})",
        f"  Linear FLOPs         x{p['linear_flops_ratio']:.4f} of unpadded",
        f"  attention FLOPs      x{p['attention_flops_ratio']:.4f} of unpadded",
    ]


def _format_collectives(c: dict) -> list[str]:
    if c.get("measured") is None:
        return [f"collectives per forward ({c['note']}):"] + [f"  {op:<24} {n:6d}" for op, n in c["implied"].items()]
    lines = [
        f"collectives per forward = one denoising step without CFG (batch {c['batch']}, "
        f"{c['input']} = {c['img_tokens']} image + {c['txt_tokens']} text tokens; "
        f"bytes = size of each full result):"
    ]
    lines += [f"  {op:<24} {e['count']:6d}  {_gb(e['bytes'])}" for op, e in c["measured"].items()]
    lines.append(f"  {'total':<24} {c['count']:6d}  {_gb(c['bytes'])}")
    if c.get("cp_measured") is not None:
        lines.append("context-parallel collectives per forward (this rank's share of the sequence):")
        lines += [f"  {op:<24} {e['count']:6d}  {_gb(e['bytes'])}" for op, e in c["cp_measured"].items()]
    if {op: e["count"] for op, e in c["measured"].items()} != c["implied"]:
        lines.append(f"  note: the plan implies {c['implied']} (one per rowwise / gathered Linear call)")
    return lines


def _format_cfg(cfg: int, exchange: dict) -> list[str]:
    lines = [f"cfg={cfg} exchange per denoising step, per rank (over the cfg axis; bytes = size of each full result):"]
    for mode, label in (("pair", "two calls (true CFG, Wan)"), ("batch", "doubled batch (SD3, PixArt)")):
        ops = ", ".join(f"{op} x{e['count']} {_gb(e['bytes']).strip()}" for op, e in exchange[mode].items())
        lines.append(f"  {label:<28} {ops}")
    return lines


def _gb(n: int) -> str:
    return f"{n / 1e9:10.3f} GB" if n >= 1e8 else f"{n / 1e6:10.3f} MB"
