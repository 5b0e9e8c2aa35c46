"""dtp on one CUDA GPU, one command: the tp=1 checks, then one rank's work of tp / cp = 2, 4, 8 at full widths,
eager and compiled, per attention backend, and ring attention's block kernel.

    python benchmarks/gpu_check.py                 # on the GPU machine (<= 8 min on one H200)
    python benchmarks/gpu_check.py --cpu-smoke     # the same code on the CPU at tiny sizes (< 2 min; in the suite)

No torchrun: the tp=1 checks run on a 1-rank process group this script starts (NCCL on the GPU, gloo for the
smoke), the sharded rows on torch's fake process group of tp / cp ranks (`gpu_rank_work.py`: rank 0's compute and
host time, no communication). Each check is a row; a failing one prints its error and the others still run (the
exit status is 1 when any row failed). Rows past the time budget (--budget-s) are listed as skipped.

tp=1 checks:
1. shard-on-load to CUDA (tiny FLUX.1 checkpoint, `dtp.from_pretrained`): every parameter and buffer on the
   GPU, output equal to diffusers' own `from_pretrained` on the GPU (fp32 and bf16);
2. the whole tiny FLUX.1 pipeline through `dtp.load_pipeline` on the GPU (bf16) vs diffusers' pipeline;
3. a medium FLUX.1 transformer (released widths: 3072, 24 heads; 2 double + 4 single blocks) at 1024^2
   (4096 image + 512 text tokens), bf16: forward time of diffusers' model vs `dtp.parallelize` at tp=1,
   eager and `torch.compile`d, and the forward's activation peak (`torch.cuda.max_memory_allocated` above
   the resident bytes) vs what `dtp.analysis.trace` predicts on fake tensors for the same forward;
4. torchao weight-only int8 / float8 on the GPU: `dtp.parallelize` then `dtp.quantize` vs torchao's
   `quantize_` on diffusers' model (the same quantization, so equal), and the time per forward;
5. `fsdp=True` on a model built on the CPU, without `device=`: every parameter and buffer on the GPU (fake group).
Writes gpu_check.md (and .json) to --out (default benchmarks/results; the smoke run: a temporary folder).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import gpu_rank_work as ranks
import torch
import torch.distributed as dist

import dtp

FLUX = "FluxTransformer2DModel"
ROWS: list[list] = []
DEVICE = "cuda"  # --cpu-smoke: the script itself on a machine without a GPU (small sizes)
SIZES = {"cuda": (4096, 512), "cpu": (64, 16)}
FACTS: dict = {}
RESULTS = Path(__file__).resolve().parent / "results"
COMPILE = {"cuda": "inductor", "cpu": "eager"}  # the smoke traces with dynamo only (no C++ compile of the CPU's)


def check(name):
    """Run one check; a failure becomes a row with its error instead of stopping the script."""

    def wrap(fn):
        def run(*args):
            start = time.perf_counter()
            try:
                fn(*args)
            except Exception as error:  # a report of what broke, not a hidden failure: the row says FAILED
                traceback.print_exc()
                ROWS.append([name, "FAILED", f"{type(error).__name__}: {str(error)[:200]}"])
            print(f"[{name}] {time.perf_counter() - start:.1f} s", flush=True)

        return run

    return wrap


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def mem_reset() -> int:
    """Reset the peak counter; the bytes allocated now (0 on the CPU, which has no such counter)."""
    if DEVICE != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def mem_peak() -> int:
    if DEVICE != "cuda":
        return 0
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def gpu_timed(fn, repeats: int = 10, warmup: int = 3) -> float:
    """Median seconds of `fn()` (synchronized before and after each call); once, unwarmed, in the smoke run."""
    repeats, warmup = (repeats, warmup) if DEVICE == "cuda" else (1, 0)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def on_gpu(module: torch.nn.Module) -> bool:
    tensors = [*module.parameters(), *module.buffers()]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return all(t.device.type == DEVICE for t in local)


def tiny_flux_inputs() -> dict:
    """The tiny FLUX.1's forward kwargs, tensors on DEVICE."""
    from dtp.families.tiny import tiny_inputs

    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in tiny_inputs(FLUX).items()}


@check("shard-on-load to cuda")
def shard_on_load(mesh, ckpt):
    from diffusers import FluxTransformer2DModel

    from dtp.families.tiny import output_tensor

    inputs = tiny_flux_inputs()
    for dtype in (torch.float32, torch.bfloat16):
        ref = FluxTransformer2DModel.from_pretrained(ckpt, subfolder="transformer", torch_dtype=dtype).to(DEVICE)
        before = mem_reset()
        ours = dtp.from_pretrained(FluxTransformer2DModel, str(ckpt), mesh, subfolder="transformer", torch_dtype=dtype)
        grew = mem_peak() - before
        weights = sum(p.numel() * p.element_size() for p in ref.parameters())
        typed = {
            k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()
        }
        with torch.no_grad():
            diff = rel(output_tensor(ours(**typed)), output_tensor(ref(**typed)))
        ROWS.append(
            [
                f"from_pretrained tiny FLUX.1 {str(dtype)[6:]}",
                "OK" if on_gpu(ours) and diff <= (1e-6 if dtype == torch.float32 else 1e-2) else "WRONG",
                f"all on cuda: {on_gpu(ours)}; rel diff vs diffusers {diff:.2e}; peak GPU bytes while loading "
                f"{grew / weights:.2f} x the weights",
            ]
        )


@check("load_pipeline on cuda")
def pipeline(mesh, ckpt):
    from diffusers import DiffusionPipeline

    from dtp.pipeline.generate import generate

    options = dict(prompt="a red cube on a table", steps=4, height=64, width=64, seed=0)
    if DEVICE != "cuda":  # the smoke run: the same calls on 2 steps of 32^2 (bf16 runs slowly on a CPU)
        options |= dict(steps=2, height=32, width=32, max_sequence_length=64)
    ref = DiffusionPipeline.from_pretrained(ckpt, torch_dtype=torch.bfloat16).to(DEVICE)
    ref_pixels, _ = generate(ref, **options)
    ours = dtp.load_pipeline(ckpt, mesh, torch_dtype=torch.bfloat16)
    placed = all(on_gpu(m) for m in ours.components.values() if isinstance(m, torch.nn.Module))
    pixels, steps = generate(ours, **options)
    diff = abs(pixels - ref_pixels)
    ROWS.append(
        [
            "load_pipeline tiny FLUX.1 bf16, 4 steps",
            "OK" if placed and diff.mean() < 1e-2 else "WRONG",
            f"all components on cuda: {placed}; mean |pixel diff| vs diffusers {diff.mean():.2e} (max "
            f"{diff.max():.2e}); step {statistics.median(steps) * 1e3:.1f} ms",
        ]
    )


def medium_flux():
    from dtp.families.tiny import random_model

    config = {"guidance_embeds": True, "num_layers": 2, "num_single_layers": 4}
    if DEVICE != "cuda":  # the smoke run: width 256 instead of 3072, one block of each kind
        config |= {"num_attention_heads": 2, "num_layers": 1, "num_single_layers": 1}
    return random_model(FLUX, config, seed=0).to(device=DEVICE, dtype=torch.bfloat16), config


def medium_inputs(model, img=None, txt=None):
    img, txt = img or SIZES[DEVICE][0], txt or SIZES[DEVICE][1]
    from dtp.families.tiny import tiny_inputs

    inputs = tiny_inputs(FLUX, config=dict(model.config), img_tokens=img, txt_tokens=txt)
    inputs["guidance"] = torch.full((1,), 3.5)
    out = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(DEVICE)
            if torch.is_floating_point(value) and key not in ("img_ids", "txt_ids"):
                value = value.to(torch.bfloat16)
        out[key] = value
    return out


def predicted_peak(config: dict, inputs: dict) -> int:
    """dtp fit's figure: the forward traced on fake tensors (one block per stack, as fit does)."""
    from dtp.analysis.trace import fake_like, fake_mode, to_fake, trace_call
    from dtp.families.tiny import model_class

    with torch.device("meta"):
        meta = model_class(FLUX).from_config(config).to(torch.bfloat16)
    with fake_mode():
        fake = to_fake(meta)
        fake_inputs = {k: fake_like(v.cpu()) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        return trace_call(fake, lambda m, **kw: m(**kw), fake_inputs).peak_bytes


@check("medium FLUX.1 step time and activation peak")
def medium(mesh):
    from dtp.families.tiny import output_tensor

    ref, config = medium_flux()
    inputs = medium_inputs(ref)
    ours = dtp.parallelize(copy.deepcopy(ref), mesh)
    with torch.no_grad():
        expected = output_tensor(ref(**inputs))
        got = output_tensor(ours(**inputs))
        t_ref = gpu_timed(lambda: ref(**inputs))
        t_ours = gpu_timed(lambda: ours(**inputs))
        resident = mem_reset()
        out = ours(**inputs)
        measured = max(mem_peak() - resident, 1)
        del out
    predicted = predicted_peak(config, inputs)
    FACTS["medium"] = dict(t_ref=t_ref, t_ours=t_ours, measured=measured, predicted=predicted)
    ROWS.append(
        [
            "medium FLUX.1 1024^2 bf16, dtp tp=1 vs diffusers",
            "OK" if rel(got, expected) < 2e-2 else "WRONG",
            f"rel diff {rel(got, expected):.2e}; forward {t_ref * 1e3:.1f} ms (diffusers) vs {t_ours * 1e3:.1f} ms "
            f"(dtp) = {t_ours / t_ref:.3f}x",
        ]
    )
    ratio = predicted / measured if DEVICE == "cuda" else 1.0  # the CPU has no allocator peak to compare with
    ROWS.append(
        [
            "activation peak: fit's fake-tensor trace vs cuda max_memory_allocated",
            "OK" if abs(ratio - 1) <= 0.10 else "OFF",
            f"predicted {predicted / 2**20:.0f} MiB, measured {measured / 2**20:.0f} MiB ({ratio:.3f}x)",
        ]
    )
    # bf16 kernels fused by inductor round differently from eager ones (diffusers' own model compiled differs
    # from its eager forward too), so the compiled dtp model is held against the compiled diffusers model.
    compiled, compiled_ref = (torch.compile(m, backend=COMPILE[DEVICE]) for m in (ours, ref))
    with torch.no_grad():
        start = time.perf_counter()
        first = output_tensor(compiled(**inputs))
        sync()
        compile_s = time.perf_counter() - start
        t_comp = gpu_timed(lambda: compiled(**inputs))
        control = output_tensor(compiled_ref(**inputs))
        t_comp_ref = gpu_timed(lambda: compiled_ref(**inputs))
    ROWS.append(
        [
            "torch.compile(dtp model) tp=1 vs torch.compile(diffusers model)",
            "OK" if rel(first, control) < 2e-2 else "WRONG",
            f"rel diff {rel(first, control):.2e} (compiled vs eager, diffusers' own: {rel(control, expected):.2e}); "
            f"first call {compile_s:.1f} s; forward {t_comp * 1e3:.1f} ms (dtp) vs {t_comp_ref * 1e3:.1f} ms "
            f"(diffusers) = {t_comp / t_comp_ref:.3f}x",
        ]
    )


@check("torchao quantization on cuda")
def quantized(mesh):
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    from dtp.families.tiny import output_tensor

    base, _ = medium_flux()
    inputs = medium_inputs(base, img=1024, txt=256) if DEVICE == "cuda" else medium_inputs(base)
    with torch.no_grad():
        full = output_tensor(base(**inputs))
    for name, make in (("int8wo", Int8WeightOnlyConfig), ("fp8wo", Float8WeightOnlyConfig)):
        ref = copy.deepcopy(base)
        quantize_(ref, make())
        ours = dtp.quantize(dtp.parallelize(copy.deepcopy(base), mesh), make())
        with torch.no_grad():
            expected = output_tensor(ref(**inputs))
            got = output_tensor(ours(**inputs))
            t_ours = gpu_timed(lambda model=ours: model(**inputs), repeats=5)
        ROWS.append(
            [
                f"{name}: parallelize then dtp.quantize vs torchao quantize_",
                "OK" if rel(got, expected) < 1e-2 else "WRONG",
                f"rel diff {rel(got, expected):.2e} (the quantization's own error vs bf16: "
                f"{rel(expected, full):.2e}); forward {t_ours * 1e3:.1f} ms",
            ]
        )
        del ref, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for gpu_check.md / .json (default benchmarks/results)")
    parser.add_argument("--cpu-smoke", action="store_true", help="the same code on the CPU at tiny sizes")
    parser.add_argument("--budget-s", type=float, default=None, help="rows after this many seconds are skipped")
    parser.add_argument(
        "--part", choices=("all", "tp1", "ranks"), default="all", help="only the tp=1 checks, or only the rank rows"
    )
    args = parser.parse_args()
    global DEVICE
    DEVICE = "cpu" if args.cpu_smoke else "cuda"
    begin = time.perf_counter()
    budget = args.budget_s or (110.0 if args.cpu_smoke else 420.0)
    setup = ranks.Setup(
        device=DEVICE,
        smoke=args.cpu_smoke,
        compile_backend=COMPILE[DEVICE],
        repeats=1 if args.cpu_smoke else 10,
        warmup=0 if args.cpu_smoke else 3,
        deadline=begin + budget,
    )
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (smoke run)"
    FACTS["env"] = dict(torch=torch.__version__, gpu=gpu, compile_backend=COMPILE[DEVICE])
    if args.out:
        out = Path(args.out)
    else:  # the smoke run never writes into the repository
        out = Path(tempfile.mkdtemp(prefix="dtp-gpu-check-")) if args.cpu_smoke else RESULTS
    if args.part in ("all", "tp1"):
        one_rank_checks(None if args.cpu_smoke else "/tmp/dtp-gpu-check")  # the smoke: the suite's shared cache
    if args.part in ("all", "ranks"):
        rank_work(setup)
    FACTS["seconds"] = time.perf_counter() - begin
    write(out, setup)
    failed = [r for r in ROWS if r[1] in ("FAILED", "WRONG")]
    failed += [r for table in setup.rows.values() for r in table if "error" in r]
    raise SystemExit(1 if failed else 0)


def one_rank_checks(root: str | None) -> None:
    """The tp=1 checks on a 1-rank process group started here (NCCL on the GPU, gloo on the CPU); the tiny checkpoint
    under `root` (None: dtp's cache, `$DTP_CACHE` or ~/.cache/dtp, which the suite's other tests read too)."""
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = dtp.make_mesh(tp=1, device_type=DEVICE)
        from dtp.families.pipelines import tiny_checkpoint

        ckpt = tiny_checkpoint("flux", root=root)
        shard_on_load(mesh, ckpt)
        pipeline(mesh, ckpt)
        medium(mesh)
        quantized(mesh)
    finally:
        dist.destroy_process_group()


@check("fsdp from a cpu model onto the device")
def fsdp_onto_device():
    """A tiny FLUX.1 built on the CPU, `dtp.parallelize(..., fsdp=True)` on a (cp=2) mesh of the device, no `device=`:
    FSDP2 moves the matrices it shards; dtp moves the vectors it leaves whole (`runtime.fsdp.move_to_fsdp_device`), so
    every parameter and buffer is on the device and a forward runs there (rank 0 of a fake process group)."""
    from dtp.analysis.fakepg import fake_world
    from dtp.families.tiny import output_tensor, tiny_model

    with fake_world(2):
        model = dtp.parallelize(tiny_model(FLUX), dtp.make_mesh(cp=2, device_type=DEVICE), fsdp=True)
        inputs = tiny_flux_inputs()
        with torch.no_grad():
            out = output_tensor(model(**inputs))
    placed = on_gpu(model)
    ok = placed and out.device.type == DEVICE and bool(torch.isfinite(out).all())
    ROWS.append(["fsdp=True from a CPU model, cp=2", "OK" if ok else "WRONG", f"all on {DEVICE}: {placed}"])


def rank_work(setup) -> None:
    """One rank's work on fake process groups: the ring block kernel, the tp / cp grid, the attention backends."""
    fsdp_onto_device()
    ranks.ring_kernel_rows(setup, ranks.SMOKE_RING_SHAPES if setup.smoke else ranks.RING_SHAPES)
    ranks.rank_rows(setup, ranks.SMOKE_MESHES if setup.smoke else {ranks.FLUX: ranks.MESHES, ranks.WAN: ranks.MESHES})
    for name in (ranks.FLUX,) if setup.smoke else (ranks.FLUX, ranks.WAN):
        ranks.backend_rows(setup, name, ranks.SMOKE_BACKENDS if setup.smoke else ranks.BACKENDS)


def write(out: Path, setup) -> None:
    lines = [
        "# dtp on one CUDA GPU",
        "",
        f"`python benchmarks/gpu_check.py` on {FACTS['env']['gpu']}, torch {torch.__version__}, compiled with "
        f"`{COMPILE[DEVICE]}`; {FACTS['seconds']:.0f} s in all.",
        "",
        "## tp=1",
        "",
        "| check | result | figures |",
        "|---|---|---|",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in ROWS),
        *ranks.tables(setup),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.md").write_text(text)
    payload = {"rows": ROWS, "facts": FACTS, **setup.rows}
    (out / "gpu_check.json").write_text(json.dumps(payload, indent=1, default=str))
    print(f"wrote {out / 'gpu_check.md'}", flush=True)


if __name__ == "__main__":
    main()
