"""One rank's work at tp / cp = 2, 4, 8 on the real device, without the other ranks: the part of `gpu_check.py`
that measures what a GPU of a sharded mesh computes and how long its host takes to launch it.

Each mesh is torch's fake process group of `degree` ranks (`dtp.analysis.fakepg.fake_world`: this process is rank
0, every collective returns at once without moving a byte), so a row is rank 0's compute plus host time with no
communication: the floor a real mesh adds its collectives to. Blocks at full widths (FLUX.1-dev: 1 double + 2
single blocks, 1024^2 = 4096 image + 512 text tokens; Wan 2.1 14B: 2 blocks, 480p x 81 frames = 32760 tokens),
bf16, each measured eager and regionally compiled (`dtp.runtime.compile.compile_blocks`, fullgraph) and per
attention backend; and ring attention's block kernel (`dtp.runtime.cp.ring`) against its fp32 reference.

Times: `device` is the median wall time of a call with the device synchronized before and after; `host` the
median time until the call returned (the launch queue may still run): host close to device means host-bound.
`vs 1 GPU / N` divides the rank's time by diffusers' unsharded blocks' time over the degree (1.00 = perfect
split of the work; above it, the rank's extra host and kernel cost).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import statistics
import time
from dataclasses import dataclass, field

import torch

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.families import FAMILIES, model_class, released_overrides
from dtp.families.tiny import output_tensor, tiny_inputs
from dtp.runtime.compile import compile_blocks
from dtp.runtime.cp import ring

FLUX, WAN = "FluxTransformer2DModel", "WanTransformer3DModel"
MESHES = [("tp", d) for d in (2, 4, 8)] + [(m, d) for m in ("ulysses", "ring") for d in (2, 4, 8)]
# The smoke runs every function once at tiny sizes: FLUX.1 on each kind of mesh, Wan at tp=2 (its q/k norm across
# heads), the backends on FLUX.1 only.
SMOKE_MESHES = {FLUX: [("tp", 2), ("ulysses", 2), ("ring", 2)], WAN: [("tp", 2)]}
BACKENDS = ("auto", "flash", "efficient", "cudnn")  # torch's SDPA kernels; `math` at full size is O(S^2) memory
SMOKE_BACKENDS = ("math",)  # "auto" is what every other row runs


@dataclass
class Setup:
    """What this run measures: the device, sizes (full or smoke), the dynamo backend, repeats, the time budget."""

    device: str
    smoke: bool
    compile_backend: str
    repeats: int
    warmup: int
    deadline: float  # time.perf_counter() after which rows are skipped (reported as such)
    rows: dict = field(default_factory=lambda: {"ranks": [], "backends": [], "ring_kernel": []})

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def over(self) -> bool:
        return time.perf_counter() > self.deadline


def timed(setup: Setup, fn) -> tuple[float, float]:
    """(median device seconds, median host seconds) of `fn()` over `setup.repeats` calls after the warm-up."""
    for _ in range(setup.warmup):
        fn()
    device, host = [], []
    for _ in range(setup.repeats):
        setup.sync()
        start = time.perf_counter()
        fn()
        returned = time.perf_counter()
        setup.sync()
        device.append(time.perf_counter() - start)
        host.append(returned - start)
    return statistics.median(device), statistics.median(host)


def block_model(setup: Setup, name: str) -> torch.nn.Module:
    """Full-width blocks of `name` on the device in bf16 (N(0, 0.02) weights), or its tiny config for the smoke."""
    cls = model_class(name)
    if setup.smoke:
        config = dict(FAMILIES[name].tiny)
    else:
        config = {**released_overrides(name), **({"num_layers": 1, "num_single_layers": 2} if name == FLUX else {})}
        config |= {"num_layers": 2} if name == WAN else {}
    with torch.device(setup.device):
        model = cls.from_config(config).to(torch.bfloat16)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    return model.eval()


def block_inputs(setup: Setup, name: str, model) -> dict:
    """One forward's inputs at the measured size, on the device, floating ones in bf16."""
    if name == FLUX:
        img, txt = (64, 16) if setup.smoke else (4096, 512)
        inputs = tiny_inputs(FLUX, config=dict(model.config), img_tokens=img, txt_tokens=txt)
        if model.config.guidance_embeds:
            inputs["guidance"] = torch.full((1,), 3.5)
    else:
        cfg = model.config
        frames, height, width = (3, 8, 8) if setup.smoke else (21, 60, 104)  # 480p x 81 frames in latents
        g = torch.Generator().manual_seed(1)
        inputs = dict(
            hidden_states=torch.randn(1, cfg.in_channels, frames, height, width, generator=g),
            timestep=torch.tensor([500]),
            encoder_hidden_states=torch.randn(1, 16 if setup.smoke else 512, cfg.text_dim, generator=g),
            return_dict=False,
        )
    out = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(setup.device)
            if value.is_floating_point() and key not in ("img_ids", "txt_ids"):
                value = value.to(torch.bfloat16)
        out[key] = value
    return out


def attention(setup: Setup, name: str):
    """The context that makes every attention call use kernel `name` (torch's SDPA selection; "auto": torch's)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return contextlib.nullcontext() if name == "auto" else sdpa_kernel([kernels[name]])


def parallelized(model, mesh, cp_mode: str, backend: str):
    """`dtp.parallelize` with `attention_backend=` where the library has it (after issue 43's attention backend
    lands; until then the SDPA selection of `attention` picks the kernel for the Ulysses and tp paths)."""
    options = {"cp_mode": cp_mode}
    if backend != "auto" and "attention_backend" in inspect.signature(dtp.parallelize).parameters:
        options["attention_backend"] = backend
    return dtp.parallelize(model, mesh, **options)


# Ring blocks run in fused kernels (`runtime/cp/kernels.py`) whose reference is `ring.reference_block`: compiled
# ring rows are measured (the old fp32 row-chunk loop would have unrolled into one enormous graph).
RING_FUSED = hasattr(ring, "reference_block")


def measure(setup: Setup, model, inputs: dict, *, ring_mode: bool, backend: str, compile: bool = True) -> dict:
    """Eager, then regionally compiled: device and host ms per call, the first compiled call's seconds.
    `compile=False`: eager only (the smoke compiles FLUX.1's rows only; each compile is seconds of CPU)."""
    torch._dynamo.reset()
    call = lambda: model(**inputs)  # noqa: E731
    with torch.no_grad(), attention(setup, backend):
        eager, eager_host = timed(setup, call)
        if ring_mode and not RING_FUSED and not setup.smoke:
            return dict(eager_ms=eager * 1e3, eager_host_ms=eager_host * 1e3, compiled="waits for the fused ring block")
        if not compile:
            return dict(eager_ms=eager * 1e3, eager_host_ms=eager_host * 1e3, compiled="eager only in the smoke")
        expected = output_tensor(call())
        compile_blocks(model, backend=setup.compile_backend)
        start = time.perf_counter()
        got = output_tensor(call())
        setup.sync()
        compile_s = time.perf_counter() - start
        compiled, compiled_host = timed(setup, call)
    finite = bool(torch.isfinite(expected).all() and torch.isfinite(got).all())
    rel = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-12)) if finite else float("nan")
    return dict(
        eager_ms=eager * 1e3,
        eager_host_ms=eager_host * 1e3,
        compiled_ms=compiled * 1e3,
        compiled_host_ms=compiled_host * 1e3,
        compile_s=compile_s,
        rel_compiled_vs_eager=rel,
    )


def compiles(setup: Setup, name: str) -> bool:
    """The smoke compiles FLUX.1's rows only (baseline, tp, Ulysses, ring: every kind of mesh once); Wan's rows and
    the backend rows run eager there. Compile on every axis is proven by tests/distributed/test_compile.py."""
    return not setup.smoke or name == FLUX


def mesh_label(axis: str, degree: int) -> str:
    return f"tp={degree}" if axis == "tp" else f"cp={degree} {axis}"


def mesh_of(axis: str, degree: int, device: str):
    return dtp.make_mesh(tp=degree if axis == "tp" else 1, cp=1 if axis == "tp" else degree, device_type=device)


def rank_rows(setup: Setup, meshes: dict) -> None:
    """diffusers' unsharded blocks of each model (the 1-GPU baseline), then rank 0's work on each of its meshes
    (`meshes`: model -> [(axis, degree)]), the models interleaved so a budget that runs out cuts every model alike."""
    bases = {name: block_model(setup, name) for name in meshes}
    inputs = {name: block_inputs(setup, name, base) for name, base in bases.items()}
    table, ones = setup.rows["ranks"], {}
    for name, base in bases.items():
        ones[name] = measure(
            setup, copy.deepcopy(base), inputs[name], ring_mode=False, backend="auto", compile=compiles(setup, name)
        )
        table.append(dict(model=name, mesh="1 GPU (diffusers)", degree=1, **ones[name]))
    order = sorted({m for ms in meshes.values() for m in ms}, key=lambda m: (m[1] != 2, m[1] != 8, MESHES.index(m)))
    for axis, degree in order:  # degree 2, then 8, then 4: the ends of the range first
        for name in [n for n in meshes if (axis, degree) in meshes[n]]:
            if setup.over():
                table.append(dict(model=name, mesh=mesh_label(axis, degree), degree=degree, skipped="time budget"))
                continue
            table.append(_rank_row(setup, name, bases[name], inputs[name], axis, degree, ones[name]))
    del bases


def _rank_row(setup: Setup, name: str, base, inputs: dict, axis: str, degree: int, one: dict) -> dict:
    row = dict(model=name, mesh=mesh_label(axis, degree), degree=degree)
    try:
        with fake_world(degree):
            mesh = mesh_of(axis, degree, setup.device)
            model = parallelized(copy.deepcopy(base), mesh, "ring" if axis == "ring" else "ulysses", "auto")
            found = measure(
                setup, model, inputs, ring_mode=axis == "ring", backend="auto", compile=compiles(setup, name)
            )
            del model
    except Exception as error:  # noqa: BLE001 - a row that failed says why; the next rows still run
        return {**row, "error": f"{type(error).__name__}: {str(error)[:300]}"}
    found["eager_vs_ideal"] = found["eager_ms"] * degree / one["eager_ms"]
    if "compiled_ms" in found:
        found["compiled_vs_ideal"] = found["compiled_ms"] * degree / one["compiled_ms"]
    return {**row, **found}


def backend_rows(setup: Setup, name: str, backends) -> None:
    """Each attention backend at cp=2 (Ulysses and ring), eager and compiled."""
    base = block_model(setup, name)
    inputs = block_inputs(setup, name, base)
    for cp_mode in ("ulysses", "ring"):
        for backend in backends:
            row = dict(model=name, mesh=f"cp=2 {cp_mode}", backend=backend)
            if setup.over():
                setup.rows["backends"].append({**row, "skipped": "time budget"})
                continue
            try:
                with fake_world(2):
                    model = parallelized(copy.deepcopy(base), mesh_of(cp_mode, 2, setup.device), cp_mode, backend)
                    row |= measure(
                        setup, model, inputs, ring_mode=cp_mode == "ring", backend=backend, compile=not setup.smoke
                    )
                    del model
            except Exception as error:  # noqa: BLE001 - e.g. a kernel this GPU or shape does not support
                row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            setup.rows["backends"].append(row)
    del base


# Shapes of one ring step's block: (label, batch, query rows, key rows, heads, head dim); FLUX.1 1024^2 at cp=2,
# Wan 2.1 14B 480p x 81 frames at cp=8.
RING_SHAPES = [("FLUX.1 1024^2 cp=2", 1, 2304, 2304, 24, 128), ("Wan 14B 480p cp=8", 1, 4095, 4095, 40, 128)]
SMOKE_RING_SHAPES = [("tiny cp=2", 1, 40, 40, 2, 16)]


def reference_block():
    """The fp32 reference of one ring block (same signature and result layout as `ring.block_attention`)."""
    return ring.reference_block


def ring_kernel_rows(setup: Setup, shapes) -> None:
    """`ring.block_attention` on bf16 q, k, v (unmasked and with the last quarter of the keys masked) against the
    fp32 reference on the same inputs: time of each, max relative difference of the output and of the LSE."""
    reference = reference_block()
    for label, b, s_q, s_k, h, d in shapes:
        for masked in (False, True):
            row = dict(block=label, mask="last 1/4 keys off" if masked else "none")
            if setup.over():
                setup.rows["ring_kernel"].append({**row, "skipped": "time budget"})
                continue
            g = torch.Generator(device=setup.device).manual_seed(0)
            q, k, v = (torch.randn(b, s, h, d, generator=g, device=setup.device) for s in (s_q, s_k, s_k))
            q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
            mask = None
            if masked:
                mask = torch.ones(b, s_k, dtype=torch.bool, device=setup.device)
                mask[:, s_k - s_k // 4 :] = False
            scale = d**-0.5
            with torch.no_grad():
                out, lse = ring.block_attention(q, k, v, mask, scale)
                ref_out, ref_lse = reference(q, k, v, mask, scale)
                fused_s, _ = timed(setup, lambda: ring.block_attention(q, k, v, mask, scale))  # noqa: B023
                ref_s, _ = timed(setup, lambda: reference(q, k, v, mask, scale))  # noqa: B023
            row |= dict(
                out_dtype=str(out.dtype).removeprefix("torch."),
                rel_out=float((out.float() - ref_out.float()).abs().max() / ref_out.float().abs().max()),
                max_lse_diff=float((lse.float() - ref_lse.float()).abs().max()),
                block_ms=fused_s * 1e3,
                reference_ms=ref_s * 1e3,
            )
            setup.rows["ring_kernel"].append(row)


def _ms(value) -> str:
    return "" if value is None else f"{value:.2f}"


def _row_note(row: dict) -> str | None:
    if "error" in row:
        return f"FAILED: {row['error']}"
    if "skipped" in row:
        return f"skipped ({row['skipped']})"
    return None


def _compiled(row: dict) -> tuple:
    """(compiled ms or None, the eager / compiled cell: a ratio, or why nothing was compiled)."""
    compiled = row.get("compiled_ms")
    return compiled, f"{row['eager_ms'] / compiled:.2f}x" if compiled else row.get("compiled", "")


def tables(setup: Setup) -> list[str]:
    """The markdown of the rank grid, the attention backends and the ring kernel rows."""
    lines = ["", "## One rank's work (fake process group: compute and host time, no communication)", ""]
    lines += [
        "| model | mesh | eager ms | eager host ms | compiled ms | compiled host ms | compile s | eager / compiled "
        "| eager vs 1 GPU / N | compiled vs 1 GPU / N |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in setup.rows["ranks"]:
        note = _row_note(r)
        head = f"| {r['model'].removesuffix('Model')} | {r['mesh']} |"
        if note:
            lines.append(f"{head} {note} | | | | | | | |")
            continue
        compiled, speed = _compiled(r)
        compile_s = f"{r['compile_s']:.1f}" if "compile_s" in r else ""
        ideal = (_ms(r.get("eager_vs_ideal")), _ms(r.get("compiled_vs_ideal")))
        lines.append(
            f"{head} {_ms(r['eager_ms'])} | {_ms(r['eager_host_ms'])} | {_ms(compiled)} | "
            f"{_ms(r.get('compiled_host_ms'))} | {compile_s} | {speed} | {ideal[0]} | {ideal[1]} |"
        )
    lines += ["", "## Attention backends (cp=2, eager and compiled)", ""]
    lines += ["| model | mesh | backend | eager ms | compiled ms | eager / compiled |", "|---|---|---|---:|---:|---:|"]
    for r in setup.rows["backends"]:
        note = _row_note(r)
        head = f"| {r['model'].removesuffix('Model')} | {r['mesh']} | {r['backend']} |"
        body = note and f" {note} | | |"
        compiled, speed = _compiled(r)
        body = body or f" {_ms(r.get('eager_ms'))} | {_ms(compiled)} | {speed} |"
        lines.append(head + body)
    lines += ["", "## Ring block: `ring.block_attention` (bf16 in) vs the fp32 reference", ""]
    lines += [
        "| block | mask | out dtype | max rel diff (out) | max abs diff (lse) | block ms | reference ms |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in setup.rows["ring_kernel"]:
        note = _row_note(r)
        head = f"| {r['block']} | {r['mask']} |"
        if note:
            lines.append(f"{head} {note} | | | | |")
            continue
        lines.append(
            f"{head} {r['out_dtype']} | {r['rel_out']:.2e} | {r['max_lse_diff']:.2e} | {_ms(r['block_ms'])} | "
            f"{_ms(r['reference_ms'])} |"
        )
    return lines
