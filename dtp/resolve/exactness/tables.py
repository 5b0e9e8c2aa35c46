"""A `shard_output` table may only reach attention whose heads are sharded: watched during the flow check's forward.

A `shard_output` rule cuts a table (RoPE cos/sin) to this rank's heads, which is right only for an
attention module that computes this rank's heads: one under an `attention` glob, its q/k/v colwise.
An attention module left whole (not under a glob) multiplies all its heads by a table cut to a few:
a shape error when the cut is wider than one head, but Mochi's per-head table `[S, heads, head_dim / 2]`
at tp = heads keeps one head per rank, and `[S, 1, head_dim / 2]` broadcasts over every head. The
forward then runs, with every head rotated by rank 0's frequencies (Mochi tiny, tp=4, attn1 left
whole: 1.9e-2 from one process). Shapes cannot see it; where the table goes can. So the flow
check's meta forward records which attention modules (a module with an integer head count) receive a
cut table, and refuses one that is not head-sharded.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from torch import nn
from torch.utils._pytree import tree_leaves

from ..binding.heads import HEAD_COUNTS
from ..binding.resolved import Resolved


class TableWatch:
    """Hooks on a sharded meta copy: the cut tables (by identity) and the attention modules they reach."""

    def __init__(self, clone: nn.Module, resolved: Resolved, where: Callable, path_in_model: Callable[[str], str]):
        self.tables: dict[int, str] = {}  # id(cut tensor) -> the shard_output module's path
        self.kept: list = []  # the cut tensors, alive so that their ids stay theirs during the forward
        self.reached: dict[str, str] = {}  # attention path in the model -> the table's module path
        for spec in resolved.outputs:
            if where(spec.path) is not None:  # after shard_meta's cut hook: sees the cut output
                clone.get_submodule(where(spec.path)).register_forward_hook(self._record(spec.path))
        for path, module in clone.named_modules():
            # instance attributes only: a diffusers model answers `num_attention_heads` from its config (deprecated)
            if any(isinstance(vars(module).get(attr), int) for attr in HEAD_COUNTS):
                module.register_forward_pre_hook(self._consumer(path_in_model(path)), with_kwargs=True)

    def _record(self, table_path: str):
        def hook(module, args, output):
            for leaf in tree_leaves(output):
                self.tables[id(leaf)] = table_path
                self.kept.append(leaf)

        return hook

    def _consumer(self, path: str):
        def hook(module, args, kwargs):
            for leaf in tree_leaves((args, kwargs)):
                if id(leaf) in self.tables:
                    self.reached.setdefault(path, self.tables[id(leaf)])

        return hook

    def failure(self, resolved: Resolved, tp: int) -> str | None:
        """The PlanError message for the first whole attention module a cut table reached (None: none did)."""
        sharded = {spec.path for spec in resolved.attention}
        whole = [path for path in self.reached if path not in sharded]
        if not whole:
            return None
        path, table = whole[0], self.reached[whole[0]]
        key = next(spec.rule.key for spec in resolved.outputs if spec.path == table)
        glob = re.sub(r"\.\d+(\.|$)", r".*\1", path, count=1)  # blocks.0.attn1 -> blocks.*.attn1
        return (
            f"plan {resolved.plan.name}, key '{key}': at tp={tp} '{table}' (shard_output) cuts its table to each "
            f"rank's heads, but it reaches attention '{path}', whose heads are not sharded (no `attention` glob "
            f"selects it): every head would be rotated by one rank's piece. Add '{glob}' to `attention` with its "
            f"q/k/v colwise and its output projection rowwise, or drop '{key}'."
        )
