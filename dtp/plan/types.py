"""The plan vocabulary: the style enum and one rule. Typed, frozen data, no torch.

A plan (`plan.py`) is a flat map from module globs to these styles. YAML files and diffusers
`_tp_plan` dicts are only serializations of it (`parse.py`, `io.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Style(str, enum.Enum):
    """How one `nn.Linear` (`y = x W^T + b`, `W` is `[out, in]`) or `nn.Embedding` (`y = W[ids]`, `W` is
    `[num_embeddings, dim]`) is split across the `tp` axis."""

    COLWISE = "colwise"  # W rows (output features) split; bias split; output stays sharded
    ROWWISE = "rowwise"  # W columns (input features) split; bias whole, added after the all-reduce
    PACKED_COLWISE = "packed_colwise"  # colwise, each fused output block split on its own
    PACKED_ROWWISE = "packed_rowwise"  # rowwise, each fused input block split on its own
    # colwise, then the output is all-gathered back to the full feature order on every rank. For
    # large Linears whose output every rank needs whole and that are applied to few rows: AdaLN
    # modulation (`norm1.linear`, `img_mod.1`: batch x k*dim per-sample vectors that downstream code
    # chunks into shift/scale/gate) and big embedders. Needs no rowwise partner.
    COLWISE_GATHERED = "colwise_gathered"
    # nn.Embedding styles (text encoders). vocab_parallel: W rows (the vocabulary) split; each rank
    # looks up the ids in its rows, ids outside them give zeros, and the partial lookups are
    # all-reduced, so the output is whole (embed_tokens, T5's `shared`).
    VOCAB_PARALLEL = "vocab_parallel"
    # embedding_colwise: W columns (the embedding dim) split; the output stays sharded like a colwise
    # Linear's. For T5's relative_attention_bias, an Embedding over heads: each rank keeps its heads' biases.
    EMBEDDING_COLWISE = "embedding_colwise"
    # Not a Linear: an RMSNorm over the whole q or k width (all heads), applied right after a colwise
    # q/k projection (Wan, SkyReels-V2, LTX, HiDream QK-norm). Its weight is split like the heads
    # (dim 0, contiguous per rank) and the sum of squares is all-reduced over `tp`, then divided by
    # the TRUE (global) width, so `y = x / sqrt(sum_r |x_r|^2 / D + eps) * w_r` is exact per rank.
    RMSNORM_ACROSS_HEADS = "rmsnorm_across_heads"
    # Not a Linear, no parameters: any module whose output tensors are per-feature tables that a
    # sharded consumer reads, e.g. RoPE tables over the full inner dim (LTX: cos/sin [B, S, heads *
    # head_dim]) or per head (Mochi: [S, heads, head_dim / 2]). Each output tensor is cut along the
    # rule's `dim` to this rank's contiguous piece, the same piece its q/k heads are.
    SHARD_OUTPUT = "shard_output"

    @property
    def is_norm(self) -> bool:
        """The rule addresses a norm module, not an nn.Linear."""
        return self is Style.RMSNORM_ACROSS_HEADS

    @property
    def is_linear(self) -> bool:
        """The rule becomes a LinearSpec: an nn.Linear, or an nn.Embedding for the embedding styles
        (every style but the norm and output ones)."""
        return self not in (Style.RMSNORM_ACROSS_HEADS, Style.SHARD_OUTPUT)

    @property
    def is_packed(self) -> bool:
        return self in (Style.PACKED_COLWISE, Style.PACKED_ROWWISE)

    @property
    def is_embedding(self) -> bool:
        """The target is an nn.Embedding (else an nn.Linear)."""
        return self in (Style.VOCAB_PARALLEL, Style.EMBEDDING_COLWISE)

    @property
    def shard_dim(self) -> int:
        """The weight dim that is split: 0 for colwise kinds, the vocabulary and norms across heads; 1 for
        rowwise kinds and an embedding's dim."""
        sharded_rows = (
            Style.COLWISE,
            Style.PACKED_COLWISE,
            Style.COLWISE_GATHERED,
            Style.VOCAB_PARALLEL,
            Style.RMSNORM_ACROSS_HEADS,
        )
        return 0 if self in sharded_rows else 1

    @property
    def gathers_output(self) -> bool:
        """The output leaves the layer whole (all-gathered or all-reduced), so it pairs with no rowwise layer."""
        return self in (Style.COLWISE_GATHERED, Style.VOCAB_PARALLEL)

    @property
    def splits_bias(self) -> bool:
        """Colwise biases follow the output features; rowwise biases are added once, after the reduce."""
        return self.shard_dim == 0


# Per-Linear attribute that diffusers uses to store absolute packed block sizes at __init__.
PACKED_BLOCKS_ATTR = {
    Style.PACKED_COLWISE: "_tp_packed_col_blocks",
    Style.PACKED_ROWWISE: "_tp_packed_row_blocks",
}


@dataclass(frozen=True)
class Rule:
    """One plan entry.

    key: module path relative to the model, with at most one `*` standing for every element of an
        `nn.ModuleList` (e.g. `transformer_blocks.*.attn.to_q`).
    style: how the Linear (or, for `rmsnorm_across_heads`, the RMSNorm) at `key` is split.
    blocks: for packed styles, proportional integers (`[1, 1]`) or absolute sizes; `None` reads
        them from the Linear's `_tp_packed_col_blocks` / `_tp_packed_row_blocks`.
    optional: only with `*`: elements of the list that lack the member (None, or not there) are
        skipped (SD3's and Mochi's context-only last block has `to_add_out = None`, `ff_context =
        None`). A path that no element has, where some element lacks it outright, is still an
        error: the flag says "some blocks lack this", never "the key may be wrong" (`globs.py`).
    """

    key: str
    style: Style
    blocks: tuple[int, ...] | None = None
    optional: bool = False
    dim: int | None = None  # for `shard_output`: the output dim that is cut (negative counts from the end)
