"""Worker side of the torch.compile matrix: a dtp-sharded tiny FLUX.1 under `torch.compile(model)` (form "full")
and diffusers' regional `model.compile_repeated_blocks(fullgraph=True)` (form "regional").

Each case shards a fresh tiny model on 2 gloo ranks, runs it eagerly at 3 timesteps, compiles it, and runs
the same 3 timesteps: the graph breaks (dynamo's `counters["graph_break"]`), the graphs compiled after the
first step (a recompilation adds one), the first call's wall and CPU time (the cold compile; CPU time of
this process, which excludes inductor's C++ compiler subprocesses) and
max |compiled - eager| / max |eager| over the 3 steps. Used by tests/distributed/test_compile.py and
benchmarks/compile.py.
"""

from __future__ import annotations

import time

import torch
from lora_cases import random_lora

import dtp
from dtp.quant import config_for
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model
from dtp.testing.tiny_vae import tiny_vae

FLUX = "FluxTransformer2DModel"
TIMESTEPS = (0.9, 0.5, 0.1)
# name -> (cp, tp, cp_mode, pad, lora, model overrides); 2 ranks each
CASES = {
    "tp": (1, 2, "ulysses", False, False, {}),
    "cp-ulysses": (2, 1, "ulysses", False, False, {}),
    "cp-ring": (2, 1, "ring", False, False, {}),
    "pad": (1, 2, "ulysses", True, False, dict(num_attention_heads=3)),  # 3 heads -> 4 at tp=2
    "lora": (1, 2, "ulysses", False, True, {}),
    "cp-sdpa": (2, 1, "ulysses", False, False, {}),  # CogVideoX: its processor calls SDPA (runtime/cp/sdpa.py)
}
MODELS = {"cp-sdpa": "CogVideoXTransformer3DModel"}  # the model of a case (default FLUX.1)
QUANT = {"int8wo": "int8wo", "fp8wo": "fp8wo", "pad-int8wo": "int8wo"}  # quantized after sharding (`dtp.quantize`)
CASES.update({name: CASES["tp"] for name in QUANT})
CASES["pad-int8wo"] = CASES["pad"]  # padded heads and int8 weights in one compile (the suite's default run)
FORMS = ("full", "regional")
# The parallel VAE's decode (`dtp.parallelize_vae` over the 2 ranks: GroupNorm statistics all-gathered, halo rows
# exchanged with batch_isend_irecv) compiled whole: case -> VAE class, form "full" only.
VAE_CASES = {"vae-kl": "AutoencoderKL", "vae-wan": "AutoencoderKLWan"}


def sharded_model(case: str) -> torch.nn.Module:
    cp, tp, cp_mode, pad, lora, overrides = CASES[case]
    model = tiny_model(MODELS.get(case, FLUX), **overrides)
    model = dtp.parallelize(model, dtp.make_mesh(tp=tp, cp=cp), cp_mode=cp_mode, pad=pad)
    if lora:
        dtp.load_lora(model, random_lora(model_for_lora(overrides), seed=3), adapter_name="a")
    if case in QUANT:
        dtp.quantize(model, config_for(QUANT[case]))
    return model


def model_for_lora(overrides: dict) -> torch.nn.Module:
    """An unsharded twin: the LoRA is sized from the full Linears, as a real adapter file is."""
    return tiny_model(FLUX, **overrides)


def _steps(model, inputs: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        return [output_tensor(model(**{**inputs, "timestep": torch.tensor([t])})) for t in TIMESTEPS]


def compile_case(case: str, form: str, backend: str) -> dict:
    """Compile one case in one form with `backend`; what it compiled and how far it is from eager."""
    if case in VAE_CASES:
        return compile_vae_case(case, form, backend)
    torch._dynamo.reset()
    inputs = tiny_inputs(MODELS.get(case, FLUX), config=None)
    model = sharded_model(case)
    eager = _steps(model, inputs)
    if form == "full":
        compiled = torch.compile(model, backend=backend)
    else:
        model.compile_repeated_blocks(fullgraph=True, backend=backend)
        compiled = model
    # Ring attention rotates K/V with a functional collective (permute_tensor): no P2P op, nothing to enable.
    found = count_compiles(
        lambda x: output_tensor(compiled(**x)), [{**inputs, "timestep": torch.tensor([t])} for t in TIMESTEPS]
    )
    found["rel"] = max(float((o - e).abs().max() / e.abs().max()) for o, e in zip(found.pop("outputs"), eager))
    return found


def compile_vae_case(case: str, form: str, backend: str) -> dict:
    """`vae.decode` of a tiny VAE split over the 2 ranks, compiled whole, on 3 latents (7 latent rows: 4 + 3 per
    rank) against the same split decode run eagerly."""
    assert form == "full", f"{case}: the VAE is compiled whole (form 'full'), not {form!r}"
    torch._dynamo.reset()
    vae = tiny_vae(VAE_CASES[case])
    channels = vae.config.get("latent_channels") or vae.config.z_dim
    frames = (3,) if vae.config.get("z_dim") else ()  # a video VAE's latents: [B, C, T, H, W]
    generator = torch.Generator().manual_seed(5)
    latents = [torch.randn(1, channels, *frames, 7, 6, generator=generator) for _ in TIMESTEPS]
    dtp.parallelize_vae(vae, dtp.make_mesh(tp=2))
    with torch.no_grad():
        eager = [vae.decode(z).sample for z in latents]
    compiled = torch.compile(lambda z: vae.decode(z).sample, backend=backend)
    with torch._dynamo.config.patch(enable_p2p_compilation=True):  # the halo exchange is P2P, as ring attention's
        found = count_compiles(compiled, latents)
    found["rel"] = max(float((o - e).abs().max() / e.abs().max()) for o, e in zip(found.pop("outputs"), eager))
    return found


def count_compiles(compiled, calls: list) -> dict:
    """Call `compiled` on each of `calls` (dynamo's counters cleared first): the outputs, graph breaks, graphs after
    the first call, recompilations after it, and the first call's wall and CPU seconds."""
    counters = torch._dynamo.utils.counters
    counters.clear()
    outputs, graphs_after_first, first_s, first_cpu_s = [], None, None, None
    with torch.no_grad():
        for x in calls:
            start, start_cpu = time.perf_counter(), time.process_time()
            outputs.append(compiled(x))
            if graphs_after_first is None:
                first_s, first_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
                graphs_after_first = counters["stats"]["unique_graphs"]
    return dict(
        outputs=outputs,
        graph_breaks=sum(counters["graph_break"].values()),
        break_reasons=sorted(counters["graph_break"])[:3],
        graphs=graphs_after_first,
        recompiles=counters["stats"]["unique_graphs"] - graphs_after_first,
        first_call_s=first_s,
        first_call_cpu_s=first_cpu_s,
    )


def run_matrix(rank: int, world_size: int, matrix: list[tuple[str, str, str]], on_case=None) -> dict:
    """Every (case, form, backend) of `matrix` on this rank: {(case, form, backend): compile_case(...)}; a case that
    raises (fullgraph=True refuses a graph break) is {"error": its first lines}, and the next case still runs."""
    results = {}
    for case, form, backend in matrix:
        try:
            results[(case, form, backend)] = compile_case(case, form, backend)
        except Exception as error:  # noqa: BLE001 - reported per case; every rank fails the same way
            results[(case, form, backend)] = {"error": " ".join(f"{type(error).__name__}: {error}".split())[:400]}
        if on_case is not None and rank == 0:
            on_case(results)  # the benchmark writes its table as each case finishes
    return results
