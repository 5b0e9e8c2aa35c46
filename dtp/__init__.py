"""dtp: tensor-parallel sharding plans for diffusion transformers, on a ("cp", "tp") DeviceMesh.

Packages, each importing only what `tests/unit/test_layers.py::ALLOWED` lists for it:
errors, policy -> styles (the vocabulary, one class per style) -> plan (rules, parsing) -> resolve (layouts,
checks) -> runtime (Parallelism, mesh, CP) -> engine (prepare/apply), parallelize -> loading -> pipeline,
adapters (LoRA); families (one module per DiT class) and analysis (check, lint, suggest, verify, fake world)
beside them; testing (fixtures) and tools (the CLI) on top.
"""

from .adapters import load_lora, load_lora_weights
from .analysis.suggest import suggest_plan
from .analysis.verify import verify
from .engine import Prepared, apply, prepare
from .errors import ForwardError, PlanError
from .loading import from_pretrained
from .parallelize import parallelize, tp_candidates
from .pipeline import load_pipeline, parallelize_pipeline
from .plan import Plan, Rule, Style, load_plan, plan_for
from .resolve import Layout
from .runtime.mesh import make_mesh

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
    "load_pipeline",
    "load_plan",
    "make_mesh",
    "parallelize",
    "parallelize_pipeline",
    "plan_for",
    "prepare",
    "suggest_plan",
    "tp_candidates",
    "verify",
]
