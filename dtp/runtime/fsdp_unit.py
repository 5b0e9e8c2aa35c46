"""The unit size of `fsdp=`: how many consecutive blocks one FSDP2 unit groups (`runtime/fsdp.unit_layout`).

    fsdp=True       dtp's units: one per block, a block over 2 x the smallest split into its children's units
    fsdp=4          4 consecutive blocks of a block list per unit (`dtp run --fsdp 4`)
    fsdp="1GB"      consecutive blocks of a block list grouped while the unit's tp-local bytes stay <= 1 GB (at least
                    one block a unit; `dtp run --fsdp 1GB`)

Why a user would group: FSDP2's host work is per unit (its pre- and post-forward hooks, one all-gather with its
copy-in and copy-out), so k blocks per unit divide it by about k; the price is memory, the running unit and its
prefetched successor whole at their tp slice: (k - 1) more blocks' bytes in flight for each of the two
(benchmarks/results/host_overhead.md, "FSDP unit size").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PlanError

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass(frozen=True)
class UnitSize:
    """A unit size other than dtp's default rule: `blocks` consecutive blocks, or blocks grouped up to `budget`
    bytes (exactly one is set)."""

    blocks: int | None = None
    budget: int | None = None


def check_fsdp_option(value) -> bool | int | str:
    """`fsdp=` as `Parallelism` keeps it: False, True, an int >= 1 (blocks per unit) or a size string such as
    "512MB" (normalized: "4" -> 4, "512 mb" -> "512MB"); PlanError otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 1:
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit() and int(text) >= 1:
            return int(text)
        match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)", text)
        if match and match.group(2).lower() in UNITS and float(match.group(1)) > 0:
            return f"{match.group(1)}{match.group(2).upper().replace('I', 'i')}"
    raise PlanError(
        f"fsdp={value!r}: give True (dtp's units: one per block, big blocks split), False, a number of blocks per "
        f"FSDP2 unit (fsdp=4, `--fsdp 4`) or a byte budget per unit (fsdp='1GB', `--fsdp 1GB`)."
    )


def unit_size(value) -> UnitSize | None:
    """The grouping `fsdp=value` asks for; None for True (dtp's default rule)."""
    value = check_fsdp_option(value)
    if value is True or value is False:
        return None
    if isinstance(value, int):
        return UnitSize(blocks=value)
    number, unit = re.fullmatch(r"([0-9.]+)([a-zA-Z]+)", value).groups()
    return UnitSize(budget=int(float(number) * UNITS[unit.lower()]))


def group_blocks(sizes: list[int], size: UnitSize) -> list[range]:
    """Consecutive index ranges of one block list's blocks (`sizes`: their bytes), one range a unit.

    `group_blocks([3, 3, 3, 3, 3], UnitSize(blocks=2)) == [range(0, 2), range(2, 4), range(4, 5)]`;
    `group_blocks([3, 3, 5, 1], UnitSize(budget=6)) == [range(0, 2), range(2, 4)]` (a block over the budget is a
    unit of its own)."""
    groups, start = [], 0
    while start < len(sizes):
        stop, total = start + 1, sizes[start]
        while stop < len(sizes) and (stop - start < size.blocks if size.blocks else total + sizes[stop] <= size.budget):
            total, stop = total + sizes[stop], stop + 1
        groups.append(range(start, stop))
        start = stop
    return groups
