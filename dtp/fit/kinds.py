"""Block kinds: which blocks of a stack `dtp fit` must trace, and how many blocks each one stands for.

fit traces a component cut to few blocks and scales each traced block's figures (weights, FLOPs, collectives) by the
blocks it stands for (`trace.scale_blocks`). Cutting every list to its first block assumes the blocks are alike;
Nucleus-Image's are not (released config: blocks 0-2 dense MLPs, 3-4 mixtures of 64 experts at capacity 4.0, 5-31 at
capacity 2.0), and block 0 alone costed every block as a dense one. So each list keeps its blocks up to the first
block of its last kind, in their places, and each kind's last kept block stands for the rest of its kind:

    Nucleus-Image (32 blocks)   kept 0-5     weights {".0": 1, ".1": 1, ".2": 1, ".3": 1, ".4": 1, ".5": 27}
    FLUX.1-dev                  kept 0 of each list   {"transformer_blocks.0": 19, "single_transformer_blocks.0": 38}
    a list of one kind          kept 0       what `trace.truncate_blocks(model, 1)` keeps

A kind is what changes a block's figures: its parameters (names, shapes, dtypes), its module types
(`forward.block_signature`), and the plain numbers, flags and strings its modules hold (`capacity_factor`,
`moe_enabled`), less the ones that only name the block's place (`layer_idx`, ...).
"""

from __future__ import annotations

from torch import nn

from ..analysis.forward import block_signature
from ..analysis.trace import block_lists

PLACE_NAMES = ("layer_idx", "layer_id", "layer_index", "layer_number", "block_idx", "block_id", "block_index", "idx")
PLAIN = (bool, int, float, str, type(None))


def block_kind(block: nn.Module) -> tuple:
    """What makes two blocks cost the same (module docstring); equal kinds, equal figures."""
    settings = tuple(
        (path, tuple(sorted((k, v) for k, v in vars(module).items() if _setting(k, v))))
        for path, module in block.named_modules()
    )
    return block_signature(block), settings


def _setting(name: str, value) -> bool:
    return not name.startswith("_") and name not in PLACE_NAMES and isinstance(value, PLAIN) and name != "training"


def cut_by_kind(model: nn.Module) -> tuple[dict[str, int], dict[str, int]]:
    """Cut every block list of `model` in place to its blocks up to the first block of its last kind (module
    docstring); returns ({list path: its full length}, {kept block's scope: blocks it stands for}): each kind's last
    kept block stands for the rest of its kind, every other kept block for itself. The kept blocks keep their
    places, so a forward that treats a block by its index (HunyuanDiT's skip blocks past the middle, Bria FIBO 2's
    text injection layers) runs each as the whole model does. With one kind per list this is
    `trace.truncate_blocks(model, 1)`, the block standing for the whole list."""
    lengths = block_lists(model)
    weights = {}
    for path in lengths:
        blocks = list(model.get_submodule(path))
        kinds = [block_kind(block) for block in blocks]
        firsts = {}
        for index, kind in enumerate(kinds):
            firsts.setdefault(kind, index)
        kept = max(firsts.values()) + 1
        last = {kind: index for index, kind in enumerate(kinds[:kept])}  # each kind's last kept block
        for index, kind in enumerate(kinds[:kept]):
            rest = kinds[kept:].count(kind)
            weights[f"{path}.{index}"] = 1 + (rest if last[kind] == index else 0)
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, name, nn.ModuleList(blocks[:kept]))
    return lengths, weights
