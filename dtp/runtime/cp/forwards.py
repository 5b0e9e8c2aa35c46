"""`cp.forward` names -> the installers of dtp's forwards (`plan.cp.ForwardRule`): each replaces a model class's
forward under CP by a copy of diffusers' with the sequence cut moved before the forward's own joins."""

from __future__ import annotations

from .framepack import install_framepack_forward
from .helios import install_helios_forward

CP_FORWARDS = {"helios": install_helios_forward, "framepack": install_framepack_forward}
