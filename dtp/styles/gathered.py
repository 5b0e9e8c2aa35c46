"""colwise_gathered: colwise, then the output all-gathered back to the full feature order on every rank.

For large Linears whose output every rank needs whole and that are applied to few rows: AdaLN modulation
(`norm1.linear`, `img_mod.1`: batch x k*dim per-sample vectors that downstream code chunks into
shift/scale/gate) and big embedders. Needs no rowwise partner.
"""

from __future__ import annotations

from .base import Style, register_style
from .parallel import GatheredColwise


class ColwiseGatheredStyle(Style):
    name = "colwise_gathered"
    shard_dim = 0
    role = "whole"
    collective = "all_gather"

    def parallel_style(self, spec, *, device=None, weights_local: bool = False):
        return GatheredColwise(spec, device=device, weights_local=weights_local)


register_style(ColwiseGatheredStyle, "COLWISE_GATHERED")
