"""`Plan`: a parsed sharding plan (the `tp` rules, the classes it is for, attention globs, `cp` section)."""

from __future__ import annotations

from dataclasses import dataclass

from .cp import CpPlan
from .parse import plan_fields
from .types import Rule


@dataclass(frozen=True)
class Plan:
    """A parsed, checked-for-syntax sharding plan.

    rules: the `tp` entries, in file order.
    models: class names this plan is written for (used by `plan_for`); empty means "any".
    attention: globs of attention modules whose head counts must be rewritten to per-rank values.
        `None` means "infer": every module with a `heads` attribute that owns a sharded Linear.
    name: where the plan came from (bundled name or file path), for messages.
    cp: the context-parallel section (sequence splits and gathers, `plan.cp.CpPlan`), or None when
        the plan supports cp=1 only.
    cfg_refused: why the cfg axis cannot split this model's calls (its inputs are not rows of one batch: OmniGen's
        per-sample index maps, Cosmos 3 Omni's packed sequence), or None; `cfg > 1` is then a PlanError saying it.
    """

    rules: tuple[Rule, ...]
    models: tuple[str, ...] = ()
    attention: tuple[str, ...] | None = None
    name: str = "<dict>"
    cp: CpPlan | None = None
    cfg_refused: str | None = None

    @classmethod
    def from_dict(cls, data: dict, *, name: str = "<dict>") -> Plan:
        """Parse a dtp plan dict (`{"tp": {...}, "models": [...], ...}`) or a diffusers `_tp_plan`.

        >>> Plan.from_dict({"blocks.*.attn.to_q": "colwise"}).rules[0].style
        <Style.COLWISE: 'colwise'>
        """
        return cls(name=name, **plan_fields(data, name))
