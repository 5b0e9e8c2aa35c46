"""Ring blocks in fused kernels, proven without a GPU: which aten op each ring step runs on fake CUDA bf16 tensors
(a fake process group, a recording dispatch mode), the CPU fused path against the fp32 reference, Ulysses' collective
counts on a fake process group, and the negative controls (the recorder sees fp32 matmuls when they run; a merge
with the wrong block's LSE; an efficient-kernel LSE left padded; the mask cache off; a rotation waited for before
its block)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import dtp
import dtp.runtime.cp.kernels as kernels_module
import dtp.runtime.cp.ring as ring_module
from dtp.analysis.collectives import CollectiveCounter
from dtp.analysis.fakepg import fake_world
from dtp.runtime.cp.kernels import CPU_FLASH_KERNEL, REFERENCE, BlockKernel, block_kernel
from dtp.runtime.cp.masks import ForwardMasks, split_mask
from dtp.runtime.cp.ring import merge, ring_attention
from dtp.styles.collectives import send_to_next, wait_for
from dtp.testing.fake_cuda import AtenIndexing, fake_cuda_like
from dtp.testing.tiny import tiny_inputs, tiny_model

CP = 4
FUSED_OPS = {
    "flash": "aten._scaled_dot_product_flash_attention.default",
    "efficient": "aten._scaled_dot_product_efficient_attention.default",
    "cudnn": "aten._scaled_dot_product_cudnn_attention.default",
}
ROTATION = "c10d.alltoall_base_.default"  # one K/V rotation in eager: the ProcessGroup's all-to-all (send_to_next)
MATMULS = ("aten.mm.", "aten.bmm.", "aten.matmul.", "aten.baddbmm.", "aten.addmm.")


class OpRecorder(TorchDispatchMode):
    """Every aten op with the dtypes of its tensor outputs."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        results = out if isinstance(out, (tuple, list)) else (out,)
        self.ops.append((str(func), tuple(t.dtype for t in results if isinstance(t, torch.Tensor))))
        return out

    def count(self, name: str) -> int:
        return sum(op == name for op, _ in self.ops)

    def fp32_matmuls(self) -> int:
        return sum(op.startswith(MATMULS) and torch.float32 in dtypes for op, dtypes in self.ops)

    def fp32_copies(self) -> int:
        return sum(op == "aten._to_copy.default" and torch.float32 in dtypes for op, dtypes in self.ops)


@pytest.fixture
def world():
    with fake_world(CP):
        yield dist.group.WORLD


def _ring_on_fake_cuda(group, *, queries: int, masked: bool, backend: str | None):
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(1, queries, 4, 64, dtype=torch.bfloat16, device="cuda")
        mask = torch.ones(1, queries, dtype=torch.bool, device="cuda") if masked else None
        with OpRecorder() as recorder:
            out = ring_attention(q, q, q, mask, group=group, backend=backend)
    return out, recorder


@pytest.mark.parametrize(
    "masked,backend,kernel",
    [(False, None, "flash"), (True, None, "efficient"), (True, "cudnn", "cudnn"), (False, "efficient", "efficient")],
)
def test_each_ring_step_runs_one_fused_op_and_no_fp32_matmul(world, masked, backend, kernel):
    """Fake CUDA bf16 q/k/v at cp=4: exactly cp fused attention ops of the chosen kind, no fp32 matmul, no fp32 copy
    of q/k/v (the only `_to_copy` to fp32 would be an upcast), output bf16 of the query's shape."""
    out, recorder = _ring_on_fake_cuda(world, queries=70, masked=masked, backend=backend)
    assert (out.dtype, tuple(out.shape), out.device.type) == (torch.bfloat16, (1, 70, 4, 64), "cuda")
    assert {k: recorder.count(op) for k, op in FUSED_OPS.items()} == {k: CP * (k == kernel) for k in FUSED_OPS}
    assert recorder.fp32_matmuls() == 0 and recorder.fp32_copies() == 0
    assert recorder.count(ROTATION) == CP - 1


class _LoggedGroup:
    """The fake process group, logging when a K/V rotation is issued ("send") and waited for ("wait")."""

    def __init__(self, group, log: list):
        self.group, self.log = group, log
        self.size, self.rank = group.size, group.rank

    def alltoall_base(self, *args):
        work = self.group.alltoall_base(*args)
        self.log.append("send")
        return _LoggedWork(work, self.log)


class _LoggedWork:
    def __init__(self, work, log: list):
        self.work, self.log = work, log

    def wait(self):
        self.log.append("wait")
        return self.work.wait()


def _ring_events(group, monkeypatch) -> list:
    log, choose = [], ring_module.block_kernel

    def logged(*args):
        kernel = choose(*args)
        return BlockKernel(kernel.name, lambda *a: (log.append("block"), kernel.run(*a))[1])

    monkeypatch.setattr(ring_module, "block_kernel", logged)
    q = torch.randn(1, 6, 2, 8)
    ring_attention(q, q, q, None, group=_LoggedGroup(group, log))
    return log


def test_the_ring_rotation_overlaps_each_block(world, monkeypatch):
    """cp=4 on the fake process group: each step's K/V rotation is issued before its block runs and waited for only
    after it, the last block sends nothing. Negative control: a wait right after the send is seen."""
    assert _ring_events(world, monkeypatch) == ["send", "block", "wait"] * (CP - 1) + ["block"]
    monkeypatch.setattr(ring_module, "send_to_next", lambda t, g: (wait_for(send_to_next(t, g)), None, None, t.shape))
    assert _ring_events(world, monkeypatch)[:3] == ["send", "wait", "block"]


def test_negative_control_the_recorder_sees_the_fp32_reference(world):
    """backend="math" (the portable fp32 path): the same recorder finds fp32 matmuls and upcasts, no fused op."""
    _, recorder = _ring_on_fake_cuda(world, queries=70, masked=False, backend="math")
    assert recorder.fp32_matmuls() >= 2 * CP and recorder.fp32_copies() >= 3 * CP
    assert sum(recorder.count(op) for op in FUSED_OPS.values()) == 0


def test_efficient_lse_is_cut_to_the_query_rows(world, monkeypatch):
    """The efficient kernel pads its LSE to a multiple of 32 rows (70 -> 96): cut, it merges; left padded (the
    negative control), the merge cannot line it up with the other blocks' LSE."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(1, 70, 4, 64, dtype=torch.bfloat16, device="cuda")
        mask = torch.ones(1, 70, dtype=torch.bool, device="cuda")
        _, lse = kernels_module.EFFICIENT(q, q, q, mask, 0.125)
        assert tuple(lse.shape) == (1, 4, 70) and lse.dtype == torch.float32
        monkeypatch.setattr(kernels_module, "lse_rows", lambda lse, queries: lse)
        _, padded = kernels_module.EFFICIENT(q, q, q, mask, 0.125)
        assert tuple(padded.shape) == (1, 4, 96)
        with pytest.raises(RuntimeError):
            ring_attention(q, q, q, mask, group=world)


def test_kernel_table():
    """`block_kernel`'s choices (module docstring of runtime/cp/kernels.py)."""
    bf16, fp32 = torch.bfloat16, torch.float32
    assert block_kernel("cuda", bf16, False).name == "flash"
    assert block_kernel("cuda", bf16, True, "flash").name == "efficient"  # flash takes no mask
    assert block_kernel("cuda", torch.float16, False, "cudnn").name == "cudnn"
    assert block_kernel("cuda", fp32, False).name == "efficient"  # flash and cuDNN take no fp32
    assert block_kernel("cuda", bf16, False, "math") is REFERENCE
    assert block_kernel("cpu", bf16, True) is CPU_FLASH_KERNEL
    assert block_kernel("xla", bf16, False) is REFERENCE
    assert block_kernel("cuda", bf16, False, None, (72, 72)).name == "flash"
    assert block_kernel("cuda", bf16, False, None, (36, 36)) is REFERENCE  # the aten ops need head dims % 8


def _blocks(seed: int = 0):
    """q over 3 key blocks: block 0 holds 4 text keys, the last 2 padding (masked); block 1 is fully masked."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 5, 3, 8, generator=g) for _ in range(3))
    ks, vs = [torch.randn(2, 6, 3, 8, generator=g) for _ in range(3)], [torch.randn(2, 6, 3, 8, generator=g)] * 3
    masks = [torch.ones(2, 6, dtype=torch.bool) for _ in range(3)]
    masks[0][1, 2:4] = False  # sample 1's padded text
    masks[1][:] = False
    return q, ks, vs, masks


def _merged(kernel, q, ks, vs, masks, lse_of=None):
    out = lse = None
    for j, (k, v, m) in enumerate(zip(ks, vs, masks)):
        o, block_lse = kernel(q, k, v, m, 8**-0.5)
        block_lse = block_lse if lse_of is None else kernel(q, ks[lse_of(j)], vs[lse_of(j)], masks[lse_of(j)], 0.35)[1]
        out, lse = (o, block_lse) if out is None else merge(out, lse, o, block_lse)
    return out


def test_cpu_fused_blocks_equal_the_fp32_reference_with_a_fully_masked_block_and_masked_text():
    """CPU flash kernel vs the fp32 reference over 3 blocks (masked text, one block fully masked): <= 1e-5, and
    both equal SDPA over all keys."""
    q, ks, vs, masks = _blocks()
    fused, reference = _merged(CPU_FLASH_KERNEL, q, ks, vs, masks), _merged(REFERENCE, q, ks, vs, masks)
    k, v, m = torch.cat(ks, 1), torch.cat(vs, 1), torch.cat(masks, 1)
    sdpa = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=m[:, None, None, :]
    ).transpose(1, 2)
    assert (fused - reference).abs().max() <= 1e-5 * reference.abs().max()
    assert (fused - sdpa).abs().max() <= 1e-5 * sdpa.abs().max()


def test_negative_control_a_merge_with_the_wrong_blocks_lse_fails():
    """Each block merged with the LSE of the next block (mod 3) misses the reference by far."""
    q, ks, vs, masks = _blocks()
    right = _merged(REFERENCE, q, ks, vs, masks)
    wrong = _merged(REFERENCE, q, ks, vs, masks, lse_of=lambda j: (j + 2) % 3)
    assert (wrong - right).abs().max() > 1e-2 * right.abs().max()


def test_split_mask_decides_expanded_masks_without_reading_them():
    """An expanded [B, H, S_q, S_k] per-key mask (stride 0 over heads and queries) is split with no host read; a
    materialised one is read (the data check `ForwardMasks` runs once per forward)."""
    keys = torch.rand(2, 6) > 0.3
    expanded = keys[:, None, None, :].expand(2, 3, 5, 6)
    with OpRecorder() as recorder:
        mask, blind = split_mask(expanded, 2, 6)
    assert torch.equal(mask, keys) and blind is None
    assert recorder.count("aten._local_scalar_dense.default") == 0
    with OpRecorder() as recorder:
        split_mask(expanded.contiguous(), 2, 6)
    assert recorder.count("aten._local_scalar_dense.default") >= 1


QWEN = "QwenImageTransformer2DModel"


def _ulysses_collectives(model, inputs) -> list:
    with torch.no_grad(), CollectiveCounter(model) as counter:
        model(**inputs)
    return counter.records


def test_ulysses_two_all_to_alls_per_attention_and_one_mask_gather_per_forward(monkeypatch):
    """Tiny Qwen-Image (masked text, batch 2), Ulysses cp=2 on a fake process group: per block one stacked q/k/v
    all-to-all and one back; the key mask gathered once per forward (again in the next forward). Negative control:
    the per-forward cache off, one gather per block."""
    with fake_world(2):
        mesh = dtp.make_mesh(cp=2, device_type="cpu")
        model = dtp.parallelize(tiny_model(QWEN), mesh, cp_mode="ulysses")
        inputs = tiny_inputs(QWEN, batch=2)
        inputs["encoder_hidden_states_mask"][1, -3:] = 0
        blocks = len(model.transformer_blocks)
        for _ in range(2):
            records = _ulysses_collectives(model, inputs)
            per_block = [Counter(r.op for r in records if r.scope == f"transformer_blocks.{i}") for i in range(blocks)]
            assert all(c["all_to_all_single"] == 2 for c in per_block), per_block
            masks = [r for r in records if r.op == "all_gather_into_tensor" and r.scope.startswith("transformer")]
            assert len(masks) == 1, records
        monkeypatch.setattr(ForwardMasks, "get", lambda self, source, key, compute: compute())
        records = _ulysses_collectives(model, inputs)
        masks = [r for r in records if r.op == "all_gather_into_tensor" and r.scope.startswith("transformer")]
        assert len(masks) == blocks


def test_tiny_flux_ring_forward_runs_on_fake_cuda():
    """Tiny FLUX.1 bf16 at cp=2 ring on fake CUDA (a fake process group; diffusers' own indexing routed by
    `AtenIndexing`): every attention's 2 blocks in the flash kernel, one K/V rotation each, no fp32 matmul."""
    cls = "FluxTransformer2DModel"
    with fake_world(2):
        mesh = dtp.make_mesh(cp=2, device_type="cpu")
        with torch.device("meta"):
            model = tiny_model(cls).to(torch.bfloat16)
        model = dtp.parallelize(model, mesh, cp_mode="ring")
        attentions = sum(1 for name, _ in model.named_modules() if name.endswith(".attn"))
        inputs = tiny_inputs(cls)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = model.to_empty(device="cuda")
            fake = {k: fake_cuda_like(v, torch.bfloat16) if torch.is_tensor(v) else v for k, v in inputs.items()}
            with torch.no_grad(), AtenIndexing(), OpRecorder() as recorder:
                model(**fake)
    assert recorder.count(FUSED_OPS["flash"]) == 2 * attentions
    assert recorder.count(ROTATION) == attentions
    assert recorder.fp32_matmuls() == 0
