"""FSDP2 over the non-tp axes: every weight divided on every axis of the mesh.

Without FSDP only the `tp` axis divides the weights; every rank of a `cp` or `cfg` group holds its tp slice
whole. With `fsdp=True`, torch's FSDP2 (`fully_shard`) shards each of those slices once more, over the mesh's
non-tp axes flattened into one (`Parallelism.fsdp_mesh`: cfg x cp ranks). No all-gather machinery is home-made:

    unit      = each element of the model's outermost ModuleLists (a transformer block), plus the root
                (embedders, norms, output projection: everything outside the blocks)
    at rest   = a parameter is dim-0 chunk r of its tp slice on fsdp rank r (torch.chunk, padded):
                Shard(0) on the fsdp axis, or (_StridedShard(0), Shard(d)) with TP inside (torchtitan's 2-D layout)
    forward   = a block's all-gather runs just before it, its whole parameters are freed right after
                (`reshard_after_forward=True`), and the next block's all-gather is issued first (prefetch; the
                last block prefetches the first for the next call); the root stays gathered after the first call

    per-rank weight bytes ~ blocks / (tp * fsdp) + root / tp + two whole blocks / tp in flight

Every rank of the fsdp group must run the same sequence of units: the cfg groups do (`runtime/cfg` runs one
forward per group per call), and so do the cp ranks (same blocks on a part of the sequence).

At tp=1 the model holds no DTensor from TP (`engine.apply` leaves it plain), so FSDP2's gathered parameters are
plain tensors in the forward: no DTensor dispatch in the compute path.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from .. import quant
from ..errors import PlanError
from .memory import local_param_bytes


def block_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """The model's outermost ModuleLists, in registration order: their elements are FSDP's units.

    e.g. FLUX.1: [("transformer_blocks", 19 blocks), ("single_transformer_blocks", 38 blocks)]. A list inside a
    block (`attn.to_out`) belongs to that block's unit.
    """
    found: list[tuple[str, nn.ModuleList]] = []
    for name, module in model.named_modules():  # pre-order: an enclosing list comes first
        if isinstance(module, nn.ModuleList) and not any(name.startswith(f"{outer}.") for outer, _ in found):
            found.append((name, module))
    return found


def fsdp_rows(length: int, fsdp: int, rank: int) -> tuple[int, int]:
    """[start, stop) of `torch.chunk(range(length), fsdp)[rank]`; empty (start == stop) past the last chunk.

    `fsdp_rows(5, 2, 1) == (3, 5)`; `fsdp_rows(1, 2, 1) == (1, 1)` (FSDP2 pads that rank's shard).
    """
    chunk = -(-length // fsdp)
    start = min(rank * chunk, length)
    return start, min(start + chunk, length)


def check_fsdp(model: nn.Module) -> None:
    """PlanError (nothing changed) when FSDP2 cannot shard `model`: sharded already, or torchao-quantized weights
    (`quant.FSDP_CANNOT`: torchao's tensors implement neither FSDP2's chunking nor its all-gather extension)."""
    if isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules()):
        raise PlanError(f"{type(model).__name__} is already sharded by FSDP2 (fully_shard); shard a fresh model.")
    quantized = [(name, quant.describe(p)) for name, p in model.named_parameters() if quant.describe(p) is not None]
    if quantized:
        name, kind = quantized[0]
        raise PlanError(
            f"fsdp=True cannot shard torchao-quantized weights: '{name}' is {kind.cls} ({kind.scheme}), and "
            f"{len(quantized)} weights like it; {quant.FSDP_CANNOT}. Use fsdp=False with quantization (TP divides "
            f"quantized weights), or leave the model unquantized with fsdp=True."
        )


def apply_fsdp(model: nn.Module, fsdp_mesh) -> nn.Module:
    """`fully_shard` each block and then the root over `fsdp_mesh`; each unit prefetches the next one.

    Units in registration order (the order the blocks run in every supported model), chained: each block's
    forward first issues the next block's all-gather, and the last block issues the first block's for the next
    call, so no call but the first waits on a block's gather (in flight: the running block and the next; between
    calls the first block's pending gather).
    The root (embedders, final norm and projection: 1-3 % of the weights) keeps its parameters gathered after
    the first call (`reshard_after_forward=False`): it runs at both ends of every call.
    """
    units = [block for _, blocks in block_lists(model) for block in blocks]
    for block in units:
        fully_shard(block, mesh=fsdp_mesh, reshard_after_forward=True)
    for block, following in zip(units, units[1:] + units[:1]):
        if following is not block:
            block.set_modules_to_forward_prefetch([following])
    fully_shard(model, mesh=fsdp_mesh, reshard_after_forward=False)
    # Free each unit's all-gather buffer right after its copy-out. By default FSDP2 keeps it until the next unit's
    # copy-out (overlap for implicit prefetching, which the chain above replaces): three blocks in flight instead of
    # two, measured on gloo (medium FLUX.1, cp=2: forward peak 53.9 MB, 44.4 MB with this, 46.8 MB without fsdp).
    model._set_unshard_async_op(True)  # torch's own switch (FSDPModule), named private in torch 2.13
    name_repeated_blocks(model)
    return model


def name_repeated_blocks(model: nn.Module) -> None:
    """Add FSDP2's renamed block classes to the instance's `_repeated_blocks`, so diffusers' regional compile
    (`model.compile_repeated_blocks(...)`) finds the blocks of an fsdp model.

    diffusers compiles each module whose `type(module).__name__` is in `model._repeated_blocks` (FLUX.1:
    ["FluxTransformerBlock", "FluxSingleTransformerBlock"]); `fully_shard` swaps each block's class for a subclass
    named `FSDPFluxTransformerBlock` (same forward), so nothing matched ("classes are not found in the model").
    e.g. FLUX.1 -> [..., "FSDPFluxTransformerBlock", "FSDPFluxSingleTransformerBlock"]. Set on the instance only:
    the class attribute, and every unsharded model, stay as they were. (The cache registry's twin: cache/enable.py.)
    """
    repeated = list(getattr(model, "_repeated_blocks", None) or ())
    renamed = []
    for module in model.modules():
        cls = type(module)
        if isinstance(module, FSDPModule) and any(base.__name__ in repeated for base in cls.__mro__[1:]):
            renamed += [cls.__name__] if cls.__name__ not in repeated + renamed else []
    if renamed:
        model._repeated_blocks = repeated + renamed


def resident_bytes(model: nn.Module) -> int:
    """Bytes a rank of the FSDP model `model` holds between calls: each block unit's shards, and the root's own
    parameters gathered at their tp slice (`reshard_after_forward=False` keeps them after the first call).

    The figure `dtp fit`'s fsdp rows put in `weight_bytes` (`fit/fsdp.py`: blocks / F + root) and `dtp check --fsdp`
    traces (`analysis/fsdp.py`). Before the first call the root is sharded too: `memory.local_param_bytes(model)`.
    e.g. FLUX.1-dev bf16 at tp=1 over F=8: 23.35 GB of blocks / 8 + 0.11 GB root.
    """
    assert is_fsdp(model), "resident_bytes() takes the root of an FSDP model"
    blocks = sum(local_param_bytes(block) for _, lst in block_lists(model) for block in lst)
    root = model._get_fsdp_state()._fsdp_param_group  # FSDP2's unit of the root's own parameters (or None)
    gathered = root.fsdp_params if root is not None else ()
    return blocks + sum(p._orig_size.numel() * p.sharded_param.element_size() for p in gathered)


def is_fsdp(model: nn.Module) -> bool:
    """Whether `model` was sharded by `apply_fsdp` (its root is an FSDP2 unit)."""
    return isinstance(model, FSDPModule)


def release(model: nn.Module) -> None:
    """Every unit of the FSDP model `model` back to its shards, no all-gather pending; no collective.

    After a call the root keeps its gathered parameters and the first block's gather, prefetched by the last block,
    is pending: its result holds the weights as they were then. Code that writes into the shards between calls
    (`fuse_lora`) runs this first, so the next call gathers what it wrote (torch's `reset_iter_state`: wait for the
    pending gathers, drop them, reshard every unit).
    """
    assert is_fsdp(model), "release() takes the root of an FSDP model"
    if model._get_fsdp_state()._is_root is None:  # no call yet (FSDP2's lazy init): all sharded, nothing pending,
        return  # and reset_iter_state would fail on the state the first call builds
    model.reset_iter_state()
