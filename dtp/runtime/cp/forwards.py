"""`cp.forward` names -> the installers of dtp's forwards (`plan.cp.ForwardRule`): each replaces a model class's
forward under CP by a copy of diffusers' with the sequence cut moved before the forward's own joins. Each is called
`(model, rule, pads, rank, cp, group)`: `group`, the cp group, for a forward that gathers its own output (Cosmos 3's
read-back); the others leave the gather to the plan's `gather`."""

from __future__ import annotations

from .cosmos3 import install_cosmos3_omni_forward
from .framepack import install_framepack_forward
from .helios import install_helios_forward

CP_FORWARDS = {
    "helios": install_helios_forward,
    "framepack": install_framepack_forward,
    "cosmos3_omni": install_cosmos3_omni_forward,
}
