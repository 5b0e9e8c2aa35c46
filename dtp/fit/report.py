"""`dtp fit`'s table (in the style of `dtp check`) and its plot (stacked bars against the GPU memory line)."""

from __future__ import annotations

COMPONENT_COLORS = {"transformer": "#4C72B0", "vae": "#8172B2"}
TEXT_COLORS = ["#55A868", "#64B5CD", "#8C8C8C"]
PHASE_COLOR = "#C44E52"
FREE_COLOR = "#EEEEEE"


def label(row: dict) -> str:
    """e.g. "cp2 ulysses tp2, fsdp, te sharded, pad"; USP: "cp8 ring4xul2 tp2"; replicas: "4 x cp2 ulysses"."""
    if row["cp"] > 1 and row["cp_mode"] == "usp":
        mesh = f"cp{row['cp']} ring{row['cp'] // row['ulysses']}xul{row['ulysses']} tp{row['tp']}"
    else:
        mesh = f"cp{row['cp']} {row['cp_mode']} tp{row['tp']}" if row["cp"] > 1 else f"tp{row['tp']}"
    if row["cfg"] > 1:
        mesh = f"cfg{row['cfg']} {mesh}"
    if row.get("replicas", 1) > 1:
        mesh = f"{row['replicas']} x {mesh}"
    extras = (["fsdp"] if row.get("fsdp") else []) + [f"te {row['text_encoders']}"]
    extras += (["pad"] if row["pad"] else []) + ([row["quant"]] if row["quant"] else [])
    return ", ".join([mesh, *extras])


def format_table(report: dict, limit: int | None = None) -> str:
    """The `dtp fit` table: one line per row, best first, then the command of each fitting row."""
    gb = report["gpu_memory_bytes"] / 1e9
    frames = f" x {report['frames']} frames" if report.get("frames") else ""
    nodes = report.get("nodes", 1)
    where = f"{report['gpus']}" if nodes == 1 else f"{nodes} nodes x {report['gpus_per_node']} ({report['inter_node']})"
    many = nodes > 1 or report.get("replicas", 1) > 1  # the columns of a multi-node or replicated fit
    lines = [
        f"dtp fit: {report['pipeline']} ({report['title']}), {report['height']}x{report['width']}{frames}, batch "
        f"{report['batch']}, {report['dtype']}, on {where} x {gb:.1f} GB ({report['hardware']}), "
        + ("compiled" if report.get("compiled") else "eager (dtp run without --compile)")
        + f", {report.get('guidance_passes', 1)} guidance pass(es) per step",
        "per rank (full-size components on the meta device, activations traced on fake tensors; GB = 1e9 bytes):",
        f"  {'#':>2} {'candidate':<44} {'weights':>8} {'text':>6} {'denoise':>8} {'decode':>7} {'peak':>7} "
        f"{'at':<8} {'fits':<4} {'s/step':>7}" + (f" {'step/s/GPU':>10} crosses nodes" if many else ""),
    ]
    rows = report["rows"][:limit] if limit else report["rows"]
    for i, r in enumerate(rows, 1):
        weights = max(r["resident_bytes"].values())
        phases = r["phase_bytes"]
        lines.append(
            f"  {i:>2} {label(r):<44} {weights / 1e9:8.2f} {phases['text'] / 1e9:6.2f} {phases['denoise'] / 1e9:8.2f} "
            f"{phases['decode'] / 1e9:7.2f} {r['peak_bytes'] / 1e9:7.2f} {r['peak_phase']:<8} "
            f"{'yes' if r['fits'] else 'no':<4} {r['step_seconds']:7.3f}"
            + (f" {r['steps_per_gpu_second']:10.3f} {','.join(r['crosses_nodes']) or '-'}" if many else "")
        )
    if limit and len(report["rows"]) > limit:
        lines.append(f"  ... {len(report['rows']) - limit} more rows (--json for all)")
    lines.append(
        "weights = the largest resident set over the phases; text / denoise / decode = activation peak of the phase; "
        "peak = max over phases of resident weights + activations; s/step = cost model (dtp/fit/cost.py)."
        + (
            " step/s/GPU = replicas / (s/step x GPUs); crosses nodes: the axes whose groups span nodes (they cost the "
            "inter-node link; tp and Ulysses never do)."
            if many
            else ""
        )
    )
    if report["reason"]:
        lines.append(f"nothing fits: {report['reason']}")
    else:
        lines.append("commands (fitting rows, best first):")
        for i, r in enumerate(rows, 1):
            if r["fits"]:
                lines.append(f"  {i:>2} {r['command']}")
        slurm = next((r for r in rows if r["fits"] and r.get("srun_command")), None)
        if slurm is not None:  # one torchrun agent per node of a SLURM allocation
            lines.append(f"the best multi-node row under SLURM: {slurm['srun_command']}")
        best = next((r for r in rows if r["fits"] and r.get("serve_command")), None)
        if best is not None:  # the same mesh, loaded once, answering HTTP requests (docs/serve.md)
            lines.append(f"serve the best row: {best['serve_command']}")
    if report["rejected"]:
        lines.append(f"{len(report['rejected'])} candidates refused by their plans (--json: 'rejected'), e.g.:")
        lines.append(f"  {label(report['rejected'][0])}: {report['rejected'][0]['reason'][:200]}")
    return "\n".join(lines)


def plot(report: dict, path: str, limit: int = 12) -> None:
    """Stacked bars per row (weights by component, the peak phase's activations, free) and the memory line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"][:limit]
    memory = report["gpu_memory_bytes"] / 1e9
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 3), 5.5))
    names = sorted({n for r in rows for n in r["weight_bytes"]}, key=_component_order)
    colors = _colors(names)
    labelled: set[str] = set()
    for x, r in enumerate(rows):
        bottom = 0.0
        phase = r["peak_phase"]
        for name in names:
            if r["weight_bytes"].get(name) and _resident(r, name, phase):
                height = r["weight_bytes"][name] / 1e9
                ax.bar(x, height, bottom=bottom, color=colors[name], label=_once(name, labelled))
                bottom += height
        act = r["phase_bytes"][phase] / 1e9
        ax.bar(
            x, act, bottom=bottom, color=PHASE_COLOR, hatch="//", label="activations (peak phase)" if x == 0 else None
        )
        bottom += act
        if bottom < memory:
            ax.bar(x, memory - bottom, bottom=bottom, color=FREE_COLOR, label="free" if x == 0 else None)
        ax.text(x, bottom + memory * 0.01, phase, ha="center", fontsize=7)
    ax.axhline(memory, color="black", linestyle="--", linewidth=1, label=f"GPU memory {memory:.0f} GB")
    ax.set_xticks(range(len(rows)), [label(r).replace(", ", "\n") for r in rows], fontsize=7)
    ax.set_ylabel("GB per rank")
    ax.set_title(
        f"{report['title']} {report['height']}x{report['width']} on {report['gpus']} x {memory:.0f} GB "
        f"({report['hardware']}): per-rank peak of a generation"
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _once(name: str, labelled: set[str]) -> str | None:
    """The legend label the first time a component is drawn, then None (one legend entry each)."""
    if name in labelled:
        return None
    labelled.add(name)
    return name


def _resident(row: dict, name: str, phase: str) -> bool:
    """Whether `name`'s weights are on the GPU in `phase` (offloaded text encoders only while encoding, as
    `candidates._apply_text_encoders` lays them out)."""
    if row["text_encoders"] == "offloaded" and name.startswith("text_encoder"):
        return phase == "text"
    return True


def _component_order(name: str) -> tuple:
    return (0 if name == "transformer" else 1 if name.startswith("text") else 2, name)


def _colors(names: list[str]) -> dict[str, str]:
    text = iter(TEXT_COLORS * 3)
    return {n: COMPONENT_COLORS.get(n) or next(text) for n in names}


def row_ulysses(row: dict) -> int:
    """A row's Ulysses degree inside cp: its own "ulysses" where the row has one (USP rows), else its cp_mode's."""
    if row.get("ulysses") is not None:
        return row["ulysses"]
    return row["cp"] if row["cp"] > 1 and row.get("cp_mode") == "ulysses" else 1


def keep_ulysses(report: dict, ulysses: int) -> dict:
    """`dtp fit --ulysses U`: the report with only the rows whose cp > 1 runs Ulysses degree U (U = 1: ring)."""
    rows = [row for row in report["rows"] if row["cp"] > 1 and row["cp"] % ulysses == 0 and row_ulysses(row) == ulysses]
    kept = dict(report, rows=rows)
    if not rows:
        kept["reason"] = f"no row with cp > 1 runs Ulysses degree {ulysses} (--ulysses {ulysses}); drop --ulysses"
    return kept
