"""dtp: tensor-parallel sharding plans for diffusion transformers, on a ("cp", "tp") DeviceMesh.

Layers, each importing only those before it (tests/unit/test_layers.py holds it):
errors, policy -> plan (data, parsing) -> resolve (layouts, checks) -> runtime (mesh, styles, CP)
-> engine (prepare/apply), parallelize -> loading -> pipeline -> adapters (LoRA) -> models (known classes,
example inputs)
-> testing (tiny configs and pipelines, local launch, parity) -> tools (cli, check, run, demo).
"""

from .adapters import load_lora, load_lora_weights
from .engine import Prepared, apply, prepare
from .errors import ForwardError, PlanError
from .loading import from_pretrained
from .parallelize import parallelize, tp_candidates
from .pipeline import parallelize_pipeline
from .plan import Plan, Rule, Style, load_plan, plan_for
from .resolve import Layout
from .runtime.mesh import make_mesh
from .tools.suggest import suggest_plan
from .tools.verify import verify
from .vae import parallelize_vae

__all__ = [
    "ForwardError",
    "Layout",
    "Plan",
    "PlanError",
    "Prepared",
    "Rule",
    "Style",
    "apply",
    "from_pretrained",
    "load_lora",
    "load_lora_weights",
    "load_plan",
    "make_mesh",
    "parallelize",
    "parallelize_pipeline",
    "parallelize_vae",
    "plan_for",
    "prepare",
    "suggest_plan",
    "tp_candidates",
    "verify",
]
