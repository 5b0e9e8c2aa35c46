"""Plans edited on purpose: the wrong plans the lint, verify and negative-control tests are built from."""

from __future__ import annotations

from ..plan import Plan


def edited(plan: Plan, changes: dict, attention=None) -> Plan:
    """`plan` with some rules replaced or added (`changes`: key -> style or {style, blocks}) or dropped (None);
    `attention` replaces its attention globs."""
    rules = {
        r.key: {"style": r.style.value, "blocks": list(r.blocks)} if r.blocks else r.style.value for r in plan.rules
    }
    for key, value in changes.items():
        if value is None:
            del rules[key]
        else:
            rules[key] = value
    data = {"tp": rules, "models": list(plan.models), "attention": list(attention or plan.attention or [])}
    return Plan.from_dict(data, name=f"{plan.name} (edited)")
