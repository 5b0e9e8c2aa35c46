"""`dtp fit`'s pieces against hand counts: FLOPs and live bytes of traced ops, collective bytes, the cost model,
block truncation, memory sizes, candidates and commands. No process group beyond torch's fake one."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtp
from dtp.analysis import fakepg
from dtp.analysis.trace import (
    PhaseTrace,
    fake_like,
    fake_mode,
    scale_blocks,
    to_fake,
    trace_call,
    truncate_blocks,
)
from dtp.fit import cost
from dtp.fit.candidates import Candidate, arrangement, candidates
from dtp.fit.estimate import cfg_exchange, command, why_none_fits
from dtp.fit.hardware import GIB, HARDWARE, hardware, parse_memory
from dtp.fit.pipelines import fit_pipeline
from dtp.testing.tiny import tiny_inputs, tiny_model


def _trace(fn, *tensors):
    with fake_mode():
        fakes = [fake_like(t) for t in tensors]
        with torch.no_grad(), PhaseTrace(resident=fakes) as tracer:
            fn(*fakes)
    return tracer.trace


def test_linear_flops_are_2_m_n_k():
    """[2, 10, 64] x Linear(64 -> 48): 2 * 20 * 64 * 48 FLOPs, bias aside."""
    layer = nn.Linear(64, 48)
    trace = _trace(lambda x, w, b: F.linear(x, w, b), torch.ones(2, 10, 64), layer.weight, layer.bias)
    assert trace.total_flops() == 2 * 20 * 64 * 48


def test_attention_flops_are_4_b_h_l_s_d():
    """SDPA of q [1, 4, 128, 16], k / v [1, 4, 96, 16]: QK^T and AV, 2 L S d each per head."""
    q, kv = torch.ones(1, 4, 128, 16), torch.ones(1, 4, 96, 16)
    trace = _trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, kv, kv)
    assert trace.total_flops() == 4 * 1 * 4 * 128 * 96 * 16


def test_peak_counts_live_storages_only():
    """x (resident) -> a = 2x -> b = a + 1 -> del a -> c = b * b: at most two new [1000] fp32 tensors live at once."""

    def fn(x):
        a = x * 2
        b = a + 1
        del a
        c = b * b
        return c

    trace = _trace(fn, torch.ones(1000))
    assert trace.peak_bytes == 2 * 4000


def test_views_of_resident_tensors_cost_nothing():
    trace = _trace(lambda x: x.view(-1)[:10].unsqueeze(0).t(), torch.ones(50, 20))
    assert trace.peak_bytes == 0


def test_tp2_pair_flops_and_all_reduce_bytes():
    """colwise Linear(32 -> 64) then rowwise Linear(64 -> 32) at tp=2, x [4, 32]: each rank does half the FLOPs
    of the pair, and one all-reduce of the [4, 32] output over 2 ranks (512 bytes, wire 2 * 1/2 * 512)."""
    from dtp.plan import Plan

    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32))
    plan = Plan.from_dict({"0": "colwise", "1": "rowwise"})
    with fakepg.fake_world(2):
        dtp.parallelize(model, dtp.make_mesh(tp=2, device_type="cpu"), plan)
        with fake_mode():
            to_fake(model)
            trace = trace_call(model, lambda m, x: m(x), {"x": torch.empty(4, 32)})
    assert trace.total_flops() == (2 * 4 * 32 * 64 + 2 * 4 * 64 * 32) // 2
    (record,) = trace.collectives
    op, nbytes, group = record.op, record.bytes, record.group
    assert (op, nbytes, group) == ("all_reduce", 4 * 32 * 4, 2)
    assert cost.wire_bytes(op, nbytes, group) == 512


def test_wire_bytes_by_collective():
    """Ring algorithms: all-reduce 2 (n-1)/n B, all-gather and all-to-all (n-1)/n B, reduce-scatter (n-1) B (B its
    result), send B; one rank: nothing."""
    assert cost.wire_bytes("all_reduce", 800, 4) == 1200
    assert cost.wire_bytes("all_gather_into_tensor", 800, 4) == 600
    assert cost.wire_bytes("alltoall_base", 800, 4) == 600
    assert cost.wire_bytes("send", 800, 2) == 800
    assert cost.wire_bytes("_reduce_scatter_base", 200, 4) == 600  # the ProcessGroup's name (Nucleus-Image at cp)
    assert cost.wire_bytes("all_reduce", 800, 1) == 0


def test_call_seconds_on_h100():
    """74.4 TFLOP (FLUX.1-dev at 1024^2) on one H100, compiled: 74.4e12 / (989e12 x 0.6) = 0.1254 s; an all-reduce
    of 28.3 MB at tp=4 adds 25 us (NCCL's small-message latency for an all-reduce, was 10 us for every kind before
    the model costed each kind) + 1.5 x 28.3 MB / 450 GB/s = 119 us."""
    h100 = HARDWARE["H100 SXM"]
    assert cost.call_seconds(74.4e12, 0, (), h100) == pytest.approx(74.4e12 / (989e12 * 0.6))
    assert cost.collective_seconds([("all_reduce", 28_311_552, 4)], h100) == pytest.approx(
        25e-6 + 1.5 * 28_311_552 / 450e9
    )
    assert cost.compute_seconds(0, 3.35e12, h100) == pytest.approx(1.0)  # memory-bound: weights read once


def test_truncated_blocks_give_the_full_models_figures():
    """Tiny FLUX.1 (2 + 2 blocks) traced whole and cut to 1 + 1: same peak, FLOPs scaled back equal."""
    inputs = tiny_inputs("FluxTransformer2DModel")
    full = tiny_model("FluxTransformer2DModel")
    cut = copy.deepcopy(full)
    lengths = truncate_blocks(cut)
    assert lengths == {"transformer_blocks": 2, "single_transformer_blocks": 2}
    assert len(cut.transformer_blocks) == len(cut.single_transformer_blocks) == 1
    traces = []
    for model in (full, cut):
        with fake_mode():
            traces.append(trace_call(model, lambda m, **kw: m(**kw), {k: fake_like(v) for k, v in inputs.items()}))
    assert traces[1].peak_bytes == traces[0].peak_bytes
    assert sum(scale_blocks(traces[1].flops, lengths).values()) == traces[0].total_flops()
    assert traces[1].total_flops() < traces[0].total_flops()


def test_parse_memory_and_hardware():
    assert parse_memory("24GiB") == 24 * GIB
    assert parse_memory("80GB") == 80 * 10**9
    assert parse_memory("49152 MiB") == 48 * GIB
    for bad in ("24 GX", "lots", "-3GB"):
        with pytest.raises(dtp.PlanError, match="24GiB"):
            parse_memory(bad)
    assert hardware(None, 24 * GIB).name == "RTX 4090"
    assert hardware(None, 80 * 10**9).name in ("H100 SXM", "A100 80GB")
    assert hardware("h100-sxm", 0).name == "H100 SXM"
    with pytest.raises(dtp.PlanError, match="H200"):
        hardware("B300", 0)


def test_candidates_of_four_gpus():
    """FLUX.1 on 4 GPUs, batch 1: (cp, tp) in (1, 4), (2, 2) x 2 modes, (4, 1) x 3 splits (ulysses 4, ring 4, ring 2
    x ulysses 2), no cfg (one call of one row: nothing to spread); sharded text encoders only with tp > 1; every quant
    scheme; the VAE always split."""
    spec = fit_pipeline("flux-pipeline")
    everything = candidates(spec, 4)
    found = [c for c in everything if not c.fsdp]
    meshes = {(c.cfg, c.cp, c.tp, c.cp_mode, c.ulysses) for c in found}
    assert meshes == {
        (1, 1, 4, None, 1),
        (1, 2, 2, "ulysses", 2),
        (1, 2, 2, "ring", 1),
        (1, 4, 1, "ulysses", 4),
        (1, 4, 1, "ring", 1),
        (1, 4, 1, "usp", 2),
    }
    assert all(c.world == 4 and c.parallel_vae for c in found)
    assert not [c for c in found if c.tp == 1 and c.text_encoders == "sharded"]
    assert {c.quant for c in found} == {None, "int8wo", "fp8wo"}
    assert len(found) == (3 * 3 + 3 * 2) * 2 * 3  # (tp > 1: 3 text-encoder modes; tp = 1: 2) x pad x quant
    fsdp = [c for c in everything if c.fsdp]  # fsdp: every mesh with cp > 1, text encoders also sharded at tp=1
    assert {(c.cp, c.tp, c.cp_mode) for c in fsdp} == {
        (2, 2, "ulysses"),
        (2, 2, "ring"),
        (4, 1, "ulysses"),
        (4, 1, "ring"),
        (4, 1, "usp"),
    }
    assert len(fsdp) == 5 * 3 * 2 and all(c.quant is None for c in fsdp)


def test_command_names_every_option():
    spec = fit_pipeline("flux-pipeline")
    from dtp.fit.pipelines import Shape

    shape = Shape(1, 2048, 1024)
    c = Candidate(cfg=2, cp=2, tp=4, cp_mode="ring", pad=True, quant="int8wo", text_encoders="whole")
    assert command(c, spec, shape) == (
        "torchrun --nproc-per-node 16 -m dtp run --model-dir ./FLUX.1-dev --prompt 'a photo of a cat' "
        "--height 2048 --width 1024 --cfg 2 --cp 2 --cp-mode ring --pad --quant int8wo --whole-text-encoders"
    )
    assert command(Candidate(), spec, shape).startswith("python -m dtp run --model-dir ./FLUX.1-dev")
    assert command(Candidate(tp=2, text_encoders="offloaded"), spec, shape).endswith("--offload-text-encoders")


def test_cfg_is_offered_where_it_pays():
    """cfg = 2 for a two-call pipeline (Qwen-Image: passes path) or a batch >= 2 (batch path); cfg = 4 only for a
    batch of 4, or LTX-2's 4 guidance passes; never for FLUX.1 at batch 1 or on an odd number of GPUs; one GPU: the VAE
    whole."""
    qwen, flux, ltx2 = (fit_pipeline(n) for n in ("qwenimage-pipeline", "flux-pipeline", "ltx2-pipeline"))
    assert {c.cfg for c in candidates(qwen, 4)} == {1, 2}
    assert {c.cfg for c in candidates(ltx2, 8)} == {1, 2, 4}
    assert {c.cfg for c in candidates(qwen, 3)} == {1}
    assert {c.cfg for c in candidates(flux, 4)} == {1}
    assert {c.cfg for c in candidates(flux, 4, batch=2)} == {1, 2}
    assert {c.cfg for c in candidates(flux, 4, batch=4)} == {1, 2, 4}
    assert not any(c.parallel_vae for c in candidates(flux, 1))


def test_cfg_layouts_halve_the_work_per_rank():
    """Qwen-Image at cfg 2 (pair): the transformer runs one call of batch 1 per step (not 2); FLUX.1 with 2 prompts at
    cfg 2 (batch): each group's calls carry 1 row; text encoders and VAE keep the whole batch, the VAE split 4 ways."""
    qwen, flux = fit_pipeline("qwenimage-pipeline"), fit_pipeline("flux-pipeline")
    pair = arrangement(Candidate(cfg=2, tp=2, parallel_vae=True), qwen, 1)
    assert (pair.cfg_path, pair.calls_per_step, pair.setups["transformer"].batch) == ("passes", 1, 1)
    assert arrangement(Candidate(tp=4, parallel_vae=True), qwen, 1).calls_per_step == 2
    split = arrangement(Candidate(cfg=2, tp=2, parallel_vae=True), flux, 2)
    assert (split.cfg_path, split.calls_per_step, split.setups["transformer"].batch) == ("batch", 1, 1)
    assert split.setups["text_encoder_2"].batch == split.setups["vae"].batch == 2
    assert split.setups["vae"].split == 4 and split.setups["transformer"].tp == 2


def test_cfg_exchange_bytes():
    """Pair path, cfg 2 on 4 ranks, output X bytes: header (2 x 512 B) and output (2 X) all-gathers over 2 ranks, two
    16-byte flag all-reduces over 4; batch path with 2 calls a step: both all-gathers twice, no flags."""
    qwen, flux = fit_pipeline("qwenimage-pipeline"), fit_pipeline("flux-pipeline")
    c = Candidate(cfg=2, tp=2, parallel_vae=True)
    x = 1000
    gathers = [("all_gather", 1024, 2, "cfg"), ("all_gather", 2 * x, 2, "cfg")]
    assert cfg_exchange(arrangement(c, qwen, 1), c, x) == gathers + [("all_reduce", 16, 4, "world")] * 2
    assert (
        cfg_exchange(arrangement(c, qwen, 2), c, x) == gathers * 2
    )  # batch 2: batch path, Qwen's two calls each split
    assert cfg_exchange(arrangement(c, flux, 2), c, x) == gathers
    assert cfg_exchange(arrangement(Candidate(tp=4), flux, 1), Candidate(tp=4), x) == []


def test_quantized_weights_count_data_and_scales():
    """int8wo of colwise Linear(32 -> 64) + rowwise Linear(64 -> 32) at tp=2, fp32: this rank holds 32 x 32 one-byte
    data + 32 fp32 row scales (+ 32 int8 zero points for int8wo) of each, the colwise bias slice (32 floats) and the
    rowwise bias whole (32 floats). Counted after sharding, under fake tensors, as fit does."""
    from dtp.analysis.trace import param_bytes_by_scope
    from dtp.plan import Plan
    from dtp.quant import config_for, quantize

    for scheme in ("int8wo", "fp8wo"):
        model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32))
        plan = Plan.from_dict({"0": "colwise", "1": "rowwise"})
        with fakepg.fake_world(2):
            dtp.parallelize(model, dtp.make_mesh(tp=2, device_type="cpu"), plan)
            with fake_mode():
                to_fake(model)
                quantize(model, config_for(scheme))
                counted = sum(param_bytes_by_scope(model).values())
        zero_points = 32 if scheme == "int8wo" else 0
        assert counted == 2 * (32 * 32 * 1 + 32 * 4 + zero_points) + 32 * 4 + 32 * 4, scheme


def test_why_none_fits_names_the_smallest_peak_and_its_phase():
    row = dict(
        cp=1, tp=2, text_encoders="sharded", peak_bytes=30e9, peak_phase="decode",
        resident_bytes={"decode": 28e9}, phase_bytes={"decode": 2e9},
    )  # fmt: skip
    reason = why_none_fits([row, {**row, "peak_bytes": 40e9}], [], 24 * 10**9)
    assert "30.0 GB" in reason and "by 6.0 GB" in reason and "decode phase: 28.0 GB of weights + 2.0 GB" in reason


def test_fit_of_a_pipeline_directory_sorts_and_explains():
    """The tiny FLUX.1 checkpoint at tp=2 (VAE split, unquantized): with memory between the peaks, fitting rows come
    first and smallest peaks fit; with 1 kB nothing fits and the reason names the smallest peak; sharded text
    encoders hold about half of the whole ones' bytes (CLIP: + its replicated embeddings and norms; T5: + its norms,
    its tied vocab-parallel table counted once on both sides)."""
    from dtp.families.pipelines import tiny_checkpoint
    from dtp.fit.measure import Measurer
    from dtp.fit.pipelines import fit_pipeline

    directory = str(tiny_checkpoint("flux"))
    measurer = Measurer(fit_pipeline(directory), torch.float32)
    options = dict(height=64, width=64, dtype="fp32", only={"cp": 1, "quant": None}, measurer=measurer)
    peaks = sorted(r["peak_bytes"] for r in dtp.fit(directory, 2, "1GB", **options)["rows"])
    assert len(peaks) == 3 and peaks[0] < peaks[-1]  # text encoders offloaded < sharded < whole
    memory = (peaks[0] + peaks[-1]) // 2
    rows = dtp.fit(directory, 2, memory, **options)["rows"]
    assert [r["fits"] for r in rows] == [p <= memory for p in peaks]
    for r in rows:
        assert r["peak_bytes"] == max(r["resident_bytes"][p] + r["phase_bytes"][p] for p in r["phase_bytes"])
    by_te = {r["text_encoders"]: r for r in rows}
    sharded, whole = by_te["sharded"]["weight_bytes"], by_te["whole"]["weight_bytes"]
    assert 0.5 * whole["text_encoder"] <= sharded["text_encoder"] < 0.65 * whole["text_encoder"]
    assert 0.5 * whole["text_encoder_2"] <= sharded["text_encoder_2"] < 0.51 * whole["text_encoder_2"]
    assert by_te["sharded"]["command"].endswith("--height 64 --width 64")
    # Quantized rows only where no unquantized twin fits: the whole-text-encoder row (the largest peak) at `memory`.
    whole = {**options, "only": {"cp": 1, "text_encoders": "whole"}}
    assert [r["quant"] for r in dtp.fit(directory, 2, "1GB", **whole)["rows"]] == [None]
    quantized = dtp.fit(directory, 2, memory, **whole)["rows"]
    assert sorted(str(r["quant"]) for r in quantized) == ["None", "fp8wo", "int8wo"]
    none = dtp.fit(directory, 2, 1000, **options)
    assert not any(r["fits"] for r in none["rows"])
    assert f"the smallest peak, {peaks[0] / 1e9:.1f} GB" in none["reason"]


def test_a_video_pipeline_s_vae_decodes_5d_latents_even_when_the_parallel_vae_does_not_know_it():
    """A video pipeline's VAE decodes [B, C, F, h, w] (Mochi's: 480 x 848 / 8; 49 frames -> 9 latent frames: Mochi's
    VAE is 6x in time, as MochiPipeline's vae_temporal_scale_factor; fit said 4 before); an image VAE [B, C, h, w]; a
    class the parallel VAE knows as a video one (CogVideoX's: 49 frames -> 13 latent frames; Mochi's since issue 45)
    5-D in any pipeline."""
    from dtp.fit.pipelines import Shape, decode_inputs
    from dtp.vae.strip_rules import VIDEO_VAES

    mochi = fakepg.meta_model("AutoencoderKLMochi", {}, dtype=torch.bfloat16)
    assert "AutoencoderKLMochi" in VIDEO_VAES
    shape = Shape(1, 480, 848, frames=49)
    assert decode_inputs(mochi, torch.bfloat16, shape, video=True)["z"].shape == (1, 12, 9, 60, 106)
    assert decode_inputs(mochi, torch.bfloat16, shape)["z"].shape == (1, 12, 9, 60, 106)
    from dtp.families.released_pipelines import FLUX_VAE

    image = fakepg.meta_model("AutoencoderKL", FLUX_VAE, dtype=torch.bfloat16)
    assert decode_inputs(image, torch.bfloat16, Shape(1, 1024, 1024))["z"].shape == (1, 16, 128, 128)
    cog = fakepg.meta_model("AutoencoderKLCogVideoX", {}, dtype=torch.bfloat16)
    assert decode_inputs(cog, torch.bfloat16, Shape(1, 480, 720, frames=49))["z"].shape == (1, 16, 13, 60, 90)


def test_a_candidate_whose_forward_refuses_its_input_is_rejected_not_fatal(monkeypatch):
    """A traced forward that raises ForwardError (a cp degree that does not divide the sequence: CogVideoX-5B's 17550
    tokens at cp=4 stopped the whole `dtp fit`) rejects that candidate with the reason; the others are rows."""
    from dtp.errors import ForwardError
    from dtp.families.pipelines import tiny_checkpoint
    from dtp.fit.measure import Measurer

    directory = str(tiny_checkpoint("flux"))
    measurer = Measurer(fit_pipeline(directory), torch.float32)
    phase = measurer.phase

    def refusing(name, setup, shape):
        if name == "transformer" and setup.cp > 1:
            raise ForwardError("sequence length 9 (dim 1) is not divisible by the cp degree 2")
        return phase(name, setup, shape)

    monkeypatch.setattr(measurer, "phase", refusing)
    report = dtp.fit(directory, 2, "1GB", height=64, width=64, dtype="fp32", only={"quant": None}, measurer=measurer)
    assert report["rows"] and all(r["cp"] == 1 for r in report["rows"])
    refused = [r for r in report["rejected"] if r["cp"] > 1]
    assert refused and all("not divisible by the cp degree 2" in r["reason"] for r in refused)


def test_a_fsdp_row_says_so_in_the_table():
    """Two rows differing only in fsdp printed the same candidate label (their commands differed by `--fsdp`)."""
    from dtp.fit.report import label

    row = dict(cfg=1, cp=2, cp_mode="ulysses", tp=2, text_encoders="whole", pad=True, quant=None)
    assert label({**row, "fsdp": True}) == "cp2 ulysses tp2, fsdp, te whole, pad"
    assert label({**row, "fsdp": False}) == "cp2 ulysses tp2, te whole, pad"


def test_data_dependent_values_are_guessed_as_the_largest_and_counted():
    """Fake tensors have no values: a boolean test is taken as False, a mask as selecting every element (the
    largest selection: its bytes are counted), each counted in `guessed_branches` (HunyuanVideo 1.5's forward has 13);
    an integer `.item()` that would size a tensor still raises."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    seen = {}

    def forward(x):
        selected = x[x > 0]  # [numel]
        seen["selected"], seen["nonzero"] = tuple(selected.shape), tuple(torch.nonzero(x).shape)
        seen["test"] = bool(torch.all(x == 0))
        return selected * 2

    trace = _trace(forward, torch.randn(4, 8))
    assert seen == {"selected": (32,), "nonzero": (32, 2), "test": False}
    assert trace.guessed_branches == 3 and trace.peak_bytes >= 2 * 32 * 4
    with pytest.raises(DataDependentOutputException):
        _trace(lambda x: torch.zeros(int(x.sum().long().item())), torch.ones(3))
