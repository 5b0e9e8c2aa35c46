"""`dtp check --kernels`: what a GPU runs, read off a forward on fake CUDA tensors (`analysis/cuda.py`, `kernels`)."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel

from dtp import PlanError
from dtp.analysis.check import check
from dtp.analysis.cuda import CudaRoute, index, sdpa_kernel_choice
from dtp.analysis.trace import PhaseTrace
from dtp.testing.tiny import TINY_CONFIGS

FLASH = "_scaled_dot_product_flash_attention bfloat16"
SHAPE = dict(resolution=128, text_tokens=16, peak=False)


@pytest.fixture(scope="module")
def tiny_flux(tmp_path_factory):
    path = tmp_path_factory.mktemp("kernels") / "config.json"
    path.write_text(json.dumps(TINY_CONFIGS["FluxTransformer2DModel"]))
    return str(path)


def _blocks(report) -> dict:
    return {row["scope"]: row for row in report["kernels"]["blocks"]}


def test_tp2_bf16_runs_flash_attention_in_every_block_and_lists_its_collectives(tiny_flux):
    """Tiny FLUX.1 at tp=2, bf16: one FlashAttention-2 call per block (torch's choice for bf16 without a mask), bf16
    matmuls only, and per block the all-reduces / all-gathers the traced forward counted."""
    report = check("flux", tp=2, config=tiny_flux, kernels=True, **SHAPE)
    blocks = _blocks(report)
    for scope in ("transformer_blocks.*", "single_transformer_blocks.*"):
        assert blocks[scope]["attention"] == {FLASH: 1}
        assert set(blocks[scope]["matmul"]) == {"bfloat16"}
        assert blocks[scope]["sync"] == {}
    assert blocks["transformer_blocks.*"]["blocks"] == 2
    k = report["kernels"]
    assert k["fused_attention"] and k["fp32_flop_share"] == 0
    measured = {op: e["count"] for op, e in report["collectives"]["measured"].items()}
    assert k["totals"]["collectives"] == measured  # the same trace: tp collectives only at cp=1


def test_ulysses_cp2_lists_the_all_to_alls_and_a_backend_changes_the_kernel(tiny_flux):
    """Ulysses cp=2: each attention runs between 2 all-to-alls (q, k, v stacked in one, the output in the other), in
    FlashAttention-2; under --attention-backend cudnn the same calls run cuDNN's fused kernel."""
    report = check("flux", tp=1, cp=2, config=tiny_flux, kernels=True, **SHAPE)
    block = _blocks(report)["transformer_blocks.*"]
    assert block["attention"] == {FLASH: 1}
    assert block["collectives"] == {"all_to_all_single": 2}, block["collectives"]
    cudnn = check("flux", tp=1, cp=2, config=tiny_flux, kernels=True, attention="cudnn", **SHAPE)
    assert _blocks(cudnn)["transformer_blocks.*"]["attention"] == {"_scaled_dot_product_cudnn_attention bfloat16": 1}
    assert cudnn["attention_backend"] == "cudnn"


@pytest.mark.full
def test_ring_cp2_reports_what_its_block_really_runs(tiny_flux):
    """Ring cp=2: the K/V pass is one exchange per ring step (cp - 1 = 1 a block: `collectives.send_to_next`, a
    ProcessGroup all-to-all with one peer each way, reported as `all_to_all_single`: this test still expected send /
    recv); its block is either one fused attention op per step with no fp32 FLOPs, or (the fp32 reference path on CUDA)
    plain fp32 matmuls and no attention op: the report says which."""
    report = check("flux", tp=1, cp=2, cp_mode="ring", config=tiny_flux, kernels=True, **SHAPE)
    block = _blocks(report)["transformer_blocks.*"]
    assert block["collectives"] == {"all_to_all_single": 1}, block["collectives"]
    k = report["kernels"]
    if k["fused_attention"]:
        assert k["fp32_flop_share"] == 0 and "float32" not in block["matmul"]
    else:
        assert k["fp32_flop_share"] > 0 and block["matmul"]["float32"] >= 1 and not block["attention"]


def test_sdpa_kernel_choice_follows_torchs_cuda_rules():
    """bf16 without a mask: flash; with a mask, or fp32: efficient; a head dim flash and efficient refuse (300, fp16,
    masked): math; `sdpa_kernel(CUDNN_ATTENTION)`: cudnn; flash only, with a mask: none ('No available kernel')."""
    q = torch.empty(1, 4, 64, 128, dtype=torch.bfloat16, device="meta")
    mask = torch.empty(1, 1, 64, 64, dtype=torch.bool, device="meta")
    assert sdpa_kernel_choice(q, q, q) == SDPBackend.FLASH_ATTENTION
    assert sdpa_kernel_choice(q, q, q, mask) == SDPBackend.EFFICIENT_ATTENTION
    assert sdpa_kernel_choice(q.float(), q.float(), q.float()) == SDPBackend.EFFICIENT_ATTENTION
    wide = torch.empty(1, 4, 64, 300, dtype=torch.float16, device="meta")
    assert sdpa_kernel_choice(wide, wide, wide, mask) == SDPBackend.MATH
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        assert sdpa_kernel_choice(q, q, q) == SDPBackend.CUDNN_ATTENTION
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert sdpa_kernel_choice(q, q, q, mask) is None


def test_indexing_routed_through_aten_equals_pythons():
    """`index` (what `CudaRoute` runs for `x[key]` on fake CUDA tensors) gives what torch's own indexing gives, on real
    cpu tensors: slices with steps, None, Ellipsis, ints, lists, long and bool tensors mixed."""
    x = torch.randn(3, 4, 5)
    keys = [
        (slice(None), None, slice(1, None), Ellipsis, slice(None, None, 2)),
        1,
        (Ellipsis, -1),
        (slice(None), [0, 2]),
        (0, slice(None), torch.tensor([1, 3])),
        x > 0,
        (slice(None), x[0, :, 0] > 0),
        (None, Ellipsis, None),
    ]
    for key in keys:
        assert torch.equal(index(x, key), x[key]), key


def test_host_syncs_and_copies_are_counted_on_fake_cuda():
    """`bool(t.any())`, a device-to-host and a host-to-device copy, a mask selection: each counted once, by kind; `~`
    and `x[mask]` run on fake CUDA tensors (they raise there without `CudaRoute`)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, 8, device="cuda")
        with pytest.raises(RuntimeError, match="not linked with support for cuda"):
            _ = ~(x > 0)
        with PhaseTrace() as tracer, CudaRoute():
            if bool((x > 0).any()):
                pass
            x.cpu()
            torch.empty(2).to("cuda")
            x[~(x > 0)]
    sync = {name: n for (_, kind, name), n in tracer.trace.kernels.items() if kind == "sync"}
    assert sync == {"_local_scalar_dense": 1, "device-to-host copy": 1, "data-dependent size (nonzero)": 1}
    assert tracer.trace.kernels[("", "h2d", "host-to-device copy")] == 1


def test_an_unknown_attention_backend_is_refused(tiny_flux):
    with pytest.raises(PlanError, match="--attention-backend no_such_kernel"):
        check("flux", tp=2, config=tiny_flux, kernels=True, attention="no_such_kernel", **SHAPE)


def test_sdpa_on_fake_cuda_runs_the_chosen_fused_op():
    """F.scaled_dot_product_attention on fake CUDA bf16 tensors dispatches the flash aten op (not the math
    decomposition this CPU build would otherwise take)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(1, 4, 64, 64, dtype=torch.bfloat16, device="cuda")
        with PhaseTrace() as tracer, CudaRoute():
            out = F.scaled_dot_product_attention(q, q, q)
    assert out.shape == q.shape and out.device.type == "cuda"
    attention = {name for (_, kind, name), _ in tracer.trace.kernels.items() if kind == "attention"}
    assert attention == {FLASH}


def test_the_cli_checks_a_cp_only_mesh_without_tp(tiny_flux, capsys):
    """`dtp check flux --cp 4 --cp-mode ring --kernels` (the issue's command) needs no `--tp`: tp defaults to 1, each
    ring step names a fused kernel, and at tp=1 no collective is said to be implied by the plan's tp styles (the
    note listed 114 all-reduces and 78 all-gathers for a tp=1 mesh that issues none). Negative control: with `--tp 2`
    the plan's tp collectives are real and measured."""
    from dtp.tools import cli

    args = ["check", "flux", "--cp", "4", "--cp-mode", "ring", "--kernels", "--config", tiny_flux, "--json"]
    args += ["--resolution", "128", "--text-tokens", "16", "--no-peak"]
    assert cli.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tp"] == 1 and report["cp"] == 4
    assert report["collectives"]["implied"] == {} and report["collectives"]["count"] == 0
    assert report["kernels"]["fused_attention"]
    assert all(FLASH in row["attention"] for row in report["kernels"]["blocks"] if row["attention"])
    assert cli.main([*args[:2], "--tp", "2", *args[2:]]) == 0
    with_tp = json.loads(capsys.readouterr().out)["collectives"]
    assert with_tp["implied"] and with_tp["count"] > 0
