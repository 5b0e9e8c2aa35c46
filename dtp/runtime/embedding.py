"""ParallelStyles for nn.Embedding: the vocabulary split across ranks, or the embedding dim split.

    vocab_parallel     y = sum_r mask_r(ids) * W_r[ids - off_r]     (W rows split; one all-reduce)
    embedding_colwise  y_r = W[:, cols_r][ids]                      (W columns split; y stays sharded)

vocab_parallel: rank r holds rows `[r V / tp, (r + 1) V / tp)` of the `[V, dim]` table. DTensor's
embedding rule does the rest exactly: with the weight `Shard(0)` and the ids `Replicate()`, each rank
looks up `ids - off_r` for the ids in its rows and writes zeros for the others (a "mask partial"
placement), and redistributing to `Replicate()` all-reduces the partial lookups. Every id is in
exactly one rank's rows, so the sum is the full lookup, bit for bit in fp32 (one non-zero term).
Example: T5-XXL's 32128 x 4096 table at tp=8: 4016 rows per rank, 33 MB instead of 263 MB in bf16.

embedding_colwise: the same lookup on this rank's columns; the output stays sharded on its last dim,
like a colwise Linear's. Used for T5's per-head relative attention bias ([buckets, heads]): rank r
gets exactly the bias of its local heads. No communication.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_module

from ..plan import Style
from ..resolve.linears import LinearSpec
from .styles import LinearStyle


class EmbeddingStyle(LinearStyle):
    """The ids enter replicated; the partitioning and the output hook are LinearStyle's."""

    input_placement = Replicate()

    def _apply(self, module: nn.Module, mesh) -> nn.Module:
        assert isinstance(module, nn.Embedding), type(module)  # resolve refuses anything else
        return distribute_module(module, mesh, self._partition, self._input, self._output)


class VocabParallel(EmbeddingStyle):
    """vocab_parallel: rows split, out-of-range ids looked up as zeros, partial lookups all-reduced."""

    output_placement = Replicate()


class EmbeddingColwise(EmbeddingStyle):
    """embedding_colwise: columns split, the output stays sharded (this rank's columns)."""

    output_placement = Shard(-1)


EMBEDDING_STYLES = {Style.VOCAB_PARALLEL: VocabParallel, Style.EMBEDDING_COLWISE: EmbeddingColwise}


def embedding_style_for(spec: LinearSpec, *, device=None, weights_local: bool = False) -> EmbeddingStyle:
    """The ParallelStyle for one resolved Embedding; slices go to `device` when given."""
    return EMBEDDING_STYLES[spec.style](spec, device=device, weights_local=weights_local)
