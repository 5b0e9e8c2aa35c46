"""dtp: tensor-parallel sharding plans for diffusion transformers, on a ("cp", "tp") DeviceMesh.

Packages, each importing only what `tests/unit/test_layers.py::ALLOWED` lists for it:
errors, policy -> styles (the vocabulary, one class per style) -> plan (rules, parsing) -> resolve (layouts,
checks) -> runtime (Parallelism, mesh, CP) -> engine (prepare/apply), parallelize -> loading -> pipeline,
adapters (LoRA); families (one module per DiT class) and analysis (check, lint, suggest, verify, fake world)
beside them; testing (fixtures) and tools (the CLI) on top.
"""

import importlib
import sys
import types

# Public name -> the module that defines it, imported on first use (PEP 562): `import dtp` and the
# `dtp` command's start-up then cost no torch import until a name is used.
_EXPORTS = {
    "load_lora": ".adapters",
    "load_lora_weights": ".adapters",
    "Prepared": ".engine",
    "apply": ".engine",
    "prepare": ".engine",
    "ForwardError": ".errors",
    "PlanError": ".errors",
    "fit": ".fit",
    "from_pretrained": ".loading",
    "parallelize": ".parallelize",
    "tp_candidates": ".parallelize",
    "load_pipeline": ".pipeline",
    "parallelize_pipeline": ".pipeline",
    "parallelize_vae": ".vae",
    "Plan": ".plan",
    "Rule": ".plan",
    "Style": ".plan",
    "load_plan": ".plan",
    "plan_for": ".plan",
    "quantize": ".quant",
    "Layout": ".resolve",
    "make_mesh": ".runtime.mesh",
    "Parallelism": ".runtime.parallelism",
    "suggest_plan": ".analysis.suggest",
    "verify": ".analysis.verify",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dtp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])


class _Facade(types.ModuleType):
    """The package module: importing the submodule `dtp.parallelize` binds the package attribute `parallelize`
    to that module, which would hide the function of the same name; that one binding is skipped."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Facade


__all__ = [
    "ForwardError",
    "Layout",
    "Parallelism",
    "Plan",
    "PlanError",
    "Prepared",
    "Rule",
    "Style",
    "apply",
    "fit",
    "from_pretrained",
    "load_lora",
    "load_lora_weights",
    "load_pipeline",
    "load_plan",
    "make_mesh",
    "parallelize",
    "parallelize_pipeline",
    "parallelize_vae",
    "plan_for",
    "prepare",
    "quantize",
    "suggest_plan",
    "tp_candidates",
    "verify",
]
