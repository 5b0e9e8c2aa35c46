"""One plan rule: a module glob and its style (`dtp/styles/`: the vocabulary, one class per style).

A plan (`plan.py`) is a flat map from module globs to these styles. YAML files and diffusers
`_tp_plan` dicts are only serializations of it (`parse.py`, `io.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..styles import Style


@dataclass(frozen=True)
class Rule:
    """One plan entry.

    key: module path relative to the model, with at most one `*` standing for every element of an
        `nn.ModuleList` (e.g. `transformer_blocks.*.attn.to_q`).
    style: how the Linear (or, for `rmsnorm_across_heads`, the RMSNorm) at `key` is split.
    blocks: for packed styles, proportional integers (`[1, 1]`) or absolute sizes; `None` reads
        them from the Linear's `_tp_packed_col_blocks` / `_tp_packed_row_blocks`.
    optional: the module exists in some blocks or under some configs only: elements of the list that lack
        the member (None, or not there) are skipped (SD3's and Mochi's context-only last block has `to_add_out =
        None`, `ff_context = None`), and the key may match nothing (Wan 2.2 Animate without `added_kv_proj_dim`).
        A missing module must be one the model's code creates under some config; a name no code creates is
        still an error: the flag says "some configs lack this", never "the key may be wrong" (`globs.py`).
    """

    key: str
    style: Style
    blocks: tuple[int, ...] | None = None
    optional: bool = False
    dim: int | None = None  # for `shard_output`: the output dim that is cut (negative counts from the end)
