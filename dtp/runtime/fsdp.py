"""FSDP2 over the non-tp axes: every weight matrix divided on every axis of the mesh (vectors kept whole).

Without FSDP only the `tp` axis divides the weights; every rank of a `cp` or `cfg` group holds its tp slice
whole. With `fsdp=True`, torch's FSDP2 (`fully_shard`) shards each of those slices once more, over the mesh's
non-tp axes flattened into one (`Parallelism.fsdp_mesh`: cfg x cp ranks). No all-gather machinery is home-made:

    unit      = each element of the model's outermost ModuleLists (a transformer block), plus the root
                (embedders, norms, output projection: everything outside the blocks); a block holding more than
                SPLIT_RATIO x the smallest main block's parameters is split: each child module with parameters is a unit
                of its own, the block's unit keeps the rest (`unit_layout`)
                with a unit size (`fsdp=4`, `fsdp="1GB"`: `fsdp_unit.py`), consecutive blocks of a list grouped
                into one unit instead (one `fully_shard` on the list of them), none split
    at rest   = a parameter is dim-0 chunk r of its tp slice on fsdp rank r (torch.chunk, padded):
                Shard(0) on the fsdp axis, or (_StridedShard(0), Shard(d)) with TP inside (torchtitan's 2-D layout);
                a vector (a 1-D parameter: bias, norm weight) is left out of FSDP2 (`ignored_params`): whole on every
                rank, as TP left it (`fsdp_shards`: VECTORS_WHOLE)
    forward   = a unit's all-gather runs just before it, its whole parameters are freed right after
                (`reshard_after_forward=True`), and the following units' all-gathers are issued first (prefetch:
                as many as fit in the smallest main block, at least one: `prefetch_windows`); the last unit prefetches
                the first window for the next call (pending between calls; a pipeline frees it before the VAE
                decode); the root stays gathered after the first call

    per-rank weight bytes ~ block matrices / (tp * fsdp) + root / tp + vectors / tp + in flight (<= 2 x the
                            largest unit's matrices / tp)

FLUX.1-dev bf16 (`dtp check flux --cp 8 --fsdp`): 19 double blocks of 0.68 GB, 38 single ones of 0.28 GB. The
double blocks split (0.68 > 2 x 0.28) into norm1 / norm1_context (0.11 GB each), attn, ff, ff_context (0.15 GB
each): in flight at most 2 x 0.28 GB while denoising, instead of 2 x 0.68 GB with a unit per block.

Every rank of the fsdp group must run the same sequence of units: the cfg groups do (`runtime/cfg` runs one
forward per group per call), and so do the cp ranks (same blocks on a part of the sequence).

At tp=1 the model holds no DTensor from TP (`engine.apply` leaves it plain), so FSDP2's gathered parameters are
plain tensors in the forward: no DTensor dispatch in the compute path.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from .. import quant
from ..errors import PlanError
from .fsdp_unit import UnitSize, group_blocks, unit_size
from .memory import local_tensor_bytes

SPLIT_RATIO = 2
"""A block holding more than SPLIT_RATIO x the smallest main block's parameter bytes is split into its children's
units: splitting pays when it at least halves what one gather brings in (FLUX.1: 0.68 / 0.28 GB = 2.4, split); a
model of blocks alike (Wan, Qwen-Image) keeps a unit per block, as FSDP is used in training."""
MAIN_SHARE = 0.1
"""A block list holding less than this share of all blocks' bytes (Chroma's guidance MLP, 3 %; an adapter) does not
set the smallest main block: its small blocks would split every main one into many small units."""
LAYOUT_ATTR = "_dtp_fsdp_layout"  # the `FsdpUnits` apply_fsdp sharded with, on the root instance
VECTORS_WHOLE = True
"""Leave every vector (a parameter of fewer than 2 dimensions: biases, norm weights) out of FSDP2's units, whole on
every rank. FSDP2's host work is per parameter (copy-in and copy-out views, a `setattr` at each unshard and reshard),
and vectors are most of the parameters but almost none of the bytes: FLUX.1-dev 656 of 1160 parameters, 6.2 MB of
23.8 GB (Wan 2.1 14B: 647 of 1095, 7.4 MB of 28.6 GB). Replicating them costs (F - 1) / F of those MB a rank; gathering
them cost 0.25-0.33x of diffusers' forward on tiny FLUX.1 at (cp=2, fsdp) (docs/fsdp.md, "Vectors"). False: FSDP2
shards them too (the rule before round 15; the benchmark's and tests' control, not an option)."""


@dataclass(frozen=True)
class Unit:
    """One FSDP2 unit below the root: `module` at `path`, gathering `size` bytes (its parameters FSDP2 shards,
    `fsdp_shards`, at their tp-local size, less those of units nested in it: a split block keeps what its children
    do not hold, often nothing)."""

    path: str
    module: nn.Module
    size: int
    inside: str | None = None  # a split block's path, for the units of its children
    members: tuple[nn.Module, ...] = ()  # the blocks grouped after `module` in one unit (`fsdp=k` or a byte budget)

    def modules(self) -> nn.Module | list[nn.Module]:
        """What `fully_shard` takes for this unit: its module, or the list of the blocks it groups."""
        return [self.module, *self.members] if self.members else self.module


@dataclass(frozen=True)
class FsdpUnits:
    """The units below the root in forward order (a split block first: its children run inside it) and `cap`, the
    smallest main block's bytes: the most a prefetch window issues beyond its first unit (`prefetch_windows`)."""

    units: tuple[Unit, ...]
    cap: int

    def gathered(self) -> list[Unit]:
        """The units with parameters: the ones that gather, prefetch and are prefetched."""
        return [u for u in self.units if u.size > 0]

    def in_flight(self) -> int:
        """The most gathered unit bytes alive at once while the blocks run (`in_flight`)."""
        return in_flight([u.size for u in self.gathered()], self.cap)


def fsdp_shards(param: torch.Tensor) -> bool:
    """Whether FSDP2 shards `param` under dtp's rule: a matrix or more (ndim >= 2, a DTensor by its global shape);
    a vector stays whole on every rank, at its tp slice (VECTORS_WHOLE)."""
    return param.ndim >= 2 or not VECTORS_WHOLE


def gathered_bytes(module: nn.Module) -> int:
    """Bytes of `module`'s parameters that FSDP2 shards and gathers (`fsdp_shards`), at their tp-local size: what a
    unit of it brings in per gather."""
    return sum(local_tensor_bytes(p) for p in module.parameters() if fsdp_shards(p))


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


def unit_layout(model: nn.Module, fsdp=True) -> FsdpUnits:
    """FSDP's units below the root of `model` (its tp slices, before FSDP shards them). `fsdp=True`, by the rule on
    sizes: each block is a unit; a block of more than SPLIT_RATIO x the smallest main block is split, each direct child
    holding parameters a unit of its own (module docstring: FLUX.1's double blocks). A unit size (`fsdp=4`,
    `fsdp="1GB"`: `runtime/fsdp_unit.py`): consecutive blocks of each block list grouped, none split."""
    lists = [(name, [gathered_bytes(block) for block in lst]) for name, lst in block_lists(model)]
    total = sum(sum(sizes) for _, sizes in lists)
    main = [size for _, sizes in lists if sum(sizes) >= MAIN_SHARE * total for size in sizes if size > 0]
    cap = min(main, default=0)
    size = unit_size(fsdp)
    if size is not None:
        return FsdpUnits(tuple(grouped_units(model, lists, size)), cap)
    blocks = [(f"{name}.{i}", block) for name, lst in block_lists(model) for i, block in enumerate(lst)]
    sizes = [size for _, list_sizes in lists for size in list_sizes]
    units: list[Unit] = []
    for (path, block), size in zip(blocks, sizes):
        split = cap > 0 and size > SPLIT_RATIO * cap
        children = [(f"{path}.{n}", c) for n, c in called_parts(block)] if split else []
        inner = [Unit(p, c, gathered_bytes(c), inside=path) for p, c in children]
        units += [Unit(path, block, size - sum(u.size for u in inner)), *inner]
    return FsdpUnits(tuple(units), cap)


def grouped_units(model: nn.Module, lists: list[tuple[str, list[int]]], size: UnitSize) -> list[Unit]:
    """Each block list's blocks in consecutive groups of `size` (`fsdp_unit.group_blocks`), a unit a group, named
    by its first block's path and holding the group's bytes; a block list never shares a unit with another."""
    units = []
    for (name, block_list), (_, sizes) in zip(block_lists(model), lists):
        for group in group_blocks(sizes, size):
            first, *rest = [block_list[i] for i in group]
            units.append(Unit(f"{name}.{group.start}", first, sum(sizes[i] for i in group), members=tuple(rest)))
    return units


def prefetch_windows(sizes: list[int], cap: int) -> list[range]:
    """Which units' all-gathers each issues before it runs, `sizes` being the gathering units' bytes in forward
    order: windows[0] is the root's (at the start of a call; a no-op when pending already), windows[i + 1] unit i's.
    A window holds the units that follow while their sum stays <= cap, and at least the next one; the last unit's
    is the root's, for the next call (pending between calls: the pipeline frees it before the VAE decode,
    `pipeline/parallelize.release_before_decode`).

    e.g. FLUX.1-dev's double block, then a single block (GB): sizes [0.11, 0.11, 0.15, 0.15, 0.15, 0.28], cap 0.28
    -> root [0, 1], [1, 2], [2], [3], [4], [5], [0, 1]: small units prefetch two ahead.
    """
    windows = []
    for start in range(len(sizes)):
        stop, total = start, 0
        while stop < len(sizes) and (stop == start or total + sizes[stop] <= cap):
            total, stop = total + sizes[stop], stop + 1
        windows.append(range(start, stop))
    return windows + windows[:1]


def in_flight(sizes: list[int], cap: int) -> int:
    """The most gathered bytes alive at once: unit i running and its window issued (any earlier window that reaches
    past i is a prefix of i's), the last unit with the first window; and unit i's copy-out, where its all-gather
    buffer and its parameters are both alive (2 x the unit) beside the rest of the window that gathered it (the
    buffer is freed right after: `apply_fsdp`'s async unshard). <= the largest unit + max(cap, largest unit).

    The copy-out term only shows where a unit is larger than what follows it: fsdp=2 on 2 double + 1 single FLUX.1
    blocks holds 2 x the double pair (2.39 MB) at its copy-out, the pair and the single block (1.44 MB) after it
    (measured on gloo: 2.42 MB above the activations, tests/distributed/test_fsdp_unit.py)."""
    windows = prefetch_windows(sizes, cap)
    alive = [sum(sizes[j] for j in windows[0])]
    alive += [size + sum(sizes[j] for j in windows[i + 1] if j != i) for i, size in enumerate(sizes)]
    alive += [size + sum(sizes[j] for j in windows[i]) for i, size in enumerate(sizes)]  # copy-out of unit i
    return max(alive)


def fsdp_rows(length: int, fsdp: int, rank: int) -> tuple[int, int]:
    """[start, stop) of `torch.chunk(range(length), fsdp)[rank]`; empty (start == stop) past the last chunk.

    `fsdp_rows(5, 2, 1) == (3, 5)`; `fsdp_rows(1, 2, 1) == (1, 1)` (FSDP2 pads that rank's shard).
    """
    chunk = -(-length // fsdp)
    start = min(rank * chunk, length)
    return start, min(start + chunk, length)


def called_parts(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules with gathered parameters that a split block's forward calls as modules, by relative path: each
    child it calls (`self.attn(...)`), else each of that child's children it calls (Kandinsky 6's fused block runs
    `self.video_dec_block.visual_modulation(...)`, never `self.video_dec_block(...)`). A module of vectors alone (a
    norm's weight: `gathered_bytes` 0) is no part: as a unit it would gather nothing and still cost FSDP2's hooks.

    FSDP2 gathers a unit's parameters in the unit's forward pre-hook: a unit whose own forward never runs would
    stay sharded while its children compute (a DTensor met a plain tensor in `addmm`). So a part is a unit only where
    the block's source calls it; anything else stays in the block's own unit (always correct, one larger gather).
    """
    try:
        source = inspect.getsource(type(block).forward)
    except (OSError, TypeError):  # no source to read (built at run time): the block stays one unit
        return []
    parts = []
    for name, child in block.named_children():
        if gathered_bytes(child) == 0:
            continue
        if re.search(rf"self\.{name}\s*\(", source):
            parts.append((name, child))
            continue
        for sub, grandchild in child.named_children():
            if gathered_bytes(grandchild) > 0 and re.search(rf"self\.{name}\.{sub}\s*\(", source):
                parts.append((f"{name}.{sub}", grandchild))
    return parts


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


def apply_fsdp(model: nn.Module, fsdp_mesh, fsdp=True) -> nn.Module:
    """`fully_shard` each unit of `unit_layout(model, fsdp)` (children before their block; a group of blocks as one
    list: one all-gather, one reshard after its last block) and then the root over `fsdp_mesh`; each gathering unit
    prefetches its `prefetch_windows` window, the root the first one. Vectors (`fsdp_shards`) stay out of every unit:
    FSDP2's `ignored_params`, whole on every rank (a tp-split bias stays the DTensor TP made it).

    The windows follow registration order until the first call has run, then the order the units ran in
    (`follow_first_call`: WanAnimate's units run out of registration order; a window that missed is still correct,
    gathered late). The root (embedders, final norm and projection: 1-3 % of
    the weights) keeps its parameters gathered after the first call (`reshard_after_forward=False`): it runs at
    both ends of every call. The last unit prefetches the first window for the next call, so no call but the first
    waits on a gather; between calls that window is pending (`release` frees it).
    """
    layout = unit_layout(model, fsdp)
    whole = {p for p in model.parameters() if not fsdp_shards(p)}  # vectors: left to every rank (VECTORS_WHOLE)
    for unit in reversed(layout.units):  # a split block's children come after it: shard them first
        fully_shard(unit.modules(), mesh=fsdp_mesh, reshard_after_forward=True, ignored_params=whole)
    fully_shard(model, mesh=fsdp_mesh, reshard_after_forward=False, ignored_params=whole)
    move_to_fsdp_device(whole, fsdp_mesh)
    chain(model, layout)
    # Free each unit's all-gather buffer right after its copy-out. By default FSDP2 keeps it until the next unit's
    # copy-out (overlap for implicit prefetching, which the windows above replace): three blocks in flight instead
    # of two, measured on gloo (medium FLUX.1, cp=2: forward peak 53.9 MB, 44.4 MB with this, 46.8 MB without fsdp).
    model._set_unshard_async_op(True)  # torch's own switch (FSDPModule), named private in torch 2.13
    setattr(model, LAYOUT_ATTR, layout)
    follow_first_call(model, layout)
    name_repeated_blocks(model, layout)
    return model


def move_to_fsdp_device(params: set[nn.Parameter], fsdp_mesh) -> None:
    """Move the parameters FSDP2 ignores where it moved the rest: `fully_shard` puts its own on the mesh's device
    (the current one of its type), a model parallelized from CPU without `device=` included, and leaves ignored ones
    where they are: a vector left on CPU would meet CUDA activations. A DTensor (a tp-split bias) is where TP put it;
    one on meta stays there (shard-on-load fills it later)."""
    kind = fsdp_mesh.device_type
    device = torch.device(kind) if kind == "cpu" else torch.device(kind, torch.get_device_module(kind).current_device())
    for param in params:
        if not isinstance(param, DTensor) and param.device not in (device, torch.device("meta")):
            param.data = param.data.to(device)


def chain(model: nn.Module, layout: FsdpUnits) -> None:
    """Each gathering unit of `layout`, in its order, prefetches its window; the root the first one (FSDP2's
    `set_modules_to_forward_prefetch`, replacing what was set before)."""
    gathered = layout.gathered()
    windows = prefetch_windows([u.size for u in gathered], layout.cap)
    for module, window in zip([model] + [u.module for u in gathered], windows):
        module.set_modules_to_forward_prefetch([gathered[j].module for j in window if gathered[j].module is not module])


def follow_first_call(model: nn.Module, layout: FsdpUnits) -> None:
    """Record the order the gathering units run in during the first call, then re-chain the windows in it (and keep
    that layout on the model): the prefetch then matches the forward whatever order the modules were registered in.
    A unit the first call did not run keeps no window and is in none (gathered when it runs)."""
    ran: list[Unit] = []
    handles = [u.module.register_forward_pre_hook(lambda m, a, u=u: ran.append(u)) for u in layout.gathered()]

    def relearn(module, args, output):
        for handle in handles:
            handle.remove()
        order = list(dict.fromkeys(ran))
        if order != layout.gathered():
            rest = [u for u in layout.units if u not in order]
            for unit in rest:
                unit.module.set_modules_to_forward_prefetch([])
            learned = FsdpUnits(tuple(order), layout.cap)
            chain(model, learned)
            setattr(model, LAYOUT_ATTR, FsdpUnits(tuple(order + rest), layout.cap))

    handles.append(model.register_forward_hook(relearn))


def name_repeated_blocks(model: nn.Module, layout: FsdpUnits) -> None:
    """Add FSDP2's renamed unit classes to the instance's `_repeated_blocks`, so diffusers' regional compile
    (`model.compile_repeated_blocks(...)`) compiles each unit of a repeated block between FSDP2's hooks.

    diffusers compiles each module whose `type(module).__name__` is in `model._repeated_blocks` (FLUX.1:
    ["FluxTransformerBlock", "FluxSingleTransformerBlock"]); `fully_shard` swaps each unit's class for a subclass
    named `FSDPFluxTransformerBlock` (same forward), so nothing matched ("classes are not found in the model").
    A block that is one unit is named as such; a split block's children are (a child unit's FSDP2 hooks inside a
    compiled block break `fullgraph=True`; its glue between them runs eagerly). e.g. FLUX.1 -> [...,
    "FSDPAdaLayerNormZero", "FSDPFluxAttention", "FSDPFeedForward", "FSDPFluxSingleTransformerBlock"]. Set on the
    instance only: the class attribute, and every unsharded model, stay as they were. (The cache registry's twin:
    cache/enable.py.)
    """
    repeated = list(getattr(model, "_repeated_blocks", None) or ())
    blocks = {u.path: u.module for u in layout.units if u.inside is None}
    split = {u.inside for u in layout.units if u.inside is not None}
    renamed = []
    for unit in layout.units:
        block_cls = type(blocks[unit.inside or unit.path])
        if not any(base.__name__ in repeated for base in block_cls.__mro__[1:]) or unit.path in split:
            continue  # not a repeated block's unit, or a split block (its children are the regions)
        name = type(unit.module).__name__
        renamed += [name] if name not in repeated + renamed else []
    if renamed:
        model._repeated_blocks = repeated + renamed


def resident_bytes(model: nn.Module) -> int:
    """Bytes a rank of the FSDP model `model` holds between calls: each block unit's shards, the root's own sharded
    parameters gathered at their tp slice (`reshard_after_forward=False` keeps them after the first call), and every
    vector whole at its tp slice (left out of FSDP2: `fsdp_shards`).

    The figure `dtp fit`'s fsdp rows put in `weight_bytes` (`fit/fsdp.py`: blocks / F + root + vectors) and `dtp check
    --fsdp` traces (`analysis/fsdp.py`). Before the first call the root is sharded too: `memory.local_param_bytes`.
    e.g. FLUX.1-dev bf16 at tp=1 over F=8: 23.35 GB of blocks / 8 + 0.11 GB root (+ 6 MB of vectors, whole).
    """
    assert is_fsdp(model), "resident_bytes() takes the root of an FSDP model"
    root = model._get_fsdp_state()._fsdp_param_group  # FSDP2's unit of the root's own parameters (or None)
    gathered = {}  # (module, name) -> bytes gathered, under every name FSDP2 knows the parameter by (a tie's too)
    for p in root.fsdp_params if root is not None else ():
        info = p._module_info
        for module, name in zip([info.module, *info.shared_modules], [info.param_name, *info.shared_param_names]):
            gathered[id(module), name] = p._orig_size.numel() * p.sharded_param.element_size()
    total, seen = 0, set()
    for module in model.modules():  # each parameter once (a tied one under its first name)
        for name, param in module._parameters.items():
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                total += gathered.get((id(module), name), local_tensor_bytes(param))
    return total


def in_flight_bytes(model: nn.Module) -> int:
    """The most gathered unit bytes a rank of the FSDP model `model` holds at once while its blocks run, above
    `resident_bytes` (`FsdpUnits.in_flight`: the running unit and its prefetch window; tp-local sizes)."""
    assert is_fsdp(model), "in_flight_bytes() takes the root of an FSDP model"
    return getattr(model, LAYOUT_ATTR).in_flight()


def is_fsdp(model: nn.Module) -> bool:
    """Whether `model` was sharded by `apply_fsdp` (its root is an FSDP2 unit)."""
    return isinstance(model, FSDPModule)


def release(model: nn.Module) -> None:
    """Every unit of the FSDP model `model` back to its shards, no all-gather pending; no collective.

    After a call the root keeps its gathered parameters and the first window's gather, prefetched by the last unit,
    is pending: its result holds the weights as they were then. Code that writes into the shards between calls
    (`fuse_lora`) runs this first, so the next call gathers what it wrote (torch's `reset_iter_state`: wait for the
    pending gathers, drop them, reshard every unit).
    """
    assert is_fsdp(model), "release() takes the root of an FSDP model"
    if model._get_fsdp_state()._is_root is None:  # no call yet (FSDP2's lazy init): all sharded, nothing pending,
        return  # and reset_iter_state would fail on the state the first call builds
    model.reset_iter_state()
