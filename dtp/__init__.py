"""dtp: tensor-parallel sharding plans for diffusion transformers, on a ("cp", "tp") DeviceMesh."""

from .errors import PlanError
from .load import from_pretrained
from .mesh import make_mesh
from .parallelize import parallelize, tp_candidates
from .plan import Plan, Rule, Style
from .plan_io import load_plan, plan_for

__all__ = ["PlanError", "Plan", "Rule", "Style", "from_pretrained", "load_plan", "make_mesh", "parallelize", "plan_for", "tp_candidates"]
