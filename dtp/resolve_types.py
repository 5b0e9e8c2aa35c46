"""Small shared record for resolve-time checks (kept apart so heads.py and resolve.py both use it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Constraint:
    """A number the TP degree must divide, with enough context for an error message."""

    value: int
    what: str  # e.g. "heads of transformer_blocks.0.attn" or "packed block 3 of ...to_qkv_mlp_proj"
    key: str  # the plan key (or `attention` entry) responsible
