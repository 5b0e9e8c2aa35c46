"""Where plans come from: YAML files, the bundled `plans/` folder, and a model's class (`plan_for`)."""

from __future__ import annotations

import importlib.resources
from functools import lru_cache
from pathlib import Path

import yaml

from ..errors import PlanError
from .plan import Plan
from .transformers import is_diffusers_model, is_transformers_model, transformers_plan


def bundled_plan_names() -> list[str]:
    """Names of the plans shipped with dtp (`plans/*.yaml`)."""
    return sorted(p.name[: -len(".yaml")] for p in _bundled_dir().iterdir() if p.name.endswith(".yaml"))


def _bundled_dir():
    # Installed: `plans/` is mapped to the package `dtp.plans` (see pyproject.toml).
    try:
        return importlib.resources.files("dtp.plans")
    except ModuleNotFoundError:  # running from a source tree that was never installed
        return Path(__file__).resolve().parents[2] / "plans"


def load_plan(name_or_path) -> Plan:
    """A bundled plan by name (`"flux"`) or a YAML file by path."""
    path = Path(str(name_or_path))
    # A folder of the current directory that happens to share a bundled plan's name ("flux") is not a plan file.
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise PlanError(f"plan file {path} does not exist.")
        return _plan_from_yaml(path.read_text(), str(path))
    resource = _bundled_dir() / f"{name_or_path}.yaml"
    if not resource.is_file():
        raise PlanError(
            f"no bundled plan named '{name_or_path}'; bundled: {', '.join(bundled_plan_names())}. "
            f"Pass a path to a YAML file for your own plan."
        )
    return _plan_from_yaml(resource.read_text(), str(name_or_path))


@lru_cache(maxsize=256)
def _plan_from_yaml(text: str, name: str) -> Plan:
    """Parsed once per (text, name): a `Plan` is immutable, and `bundled_plans_for` reads every bundled plan on each
    call (34 YAML files: 0.3-0.7 s, once per component that `dtp fit` traces)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanError(f"plan {name}: malformed YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tp"), dict):
        raise PlanError(f"plan {name}: a YAML plan must be a mapping with a `tp` mapping of rules.")
    return Plan.from_dict(data, name=name)


def plan_for(model) -> Plan:
    """The bundled plan whose `models` names the model's class, else the model's own plan (see `find_plan`);
    PlanError when there is none."""
    plan = find_plan(model)
    if plan is None:
        raise PlanError(
            f"no plan for {type(model).__name__}: no bundled plan lists it ({', '.join(bundled_plan_names())}) and it "
            f"is no diffusers or transformers model with a plan of its own. Write a YAML plan and pass it as `plan=`."
        )
    return plan


def bundled_plans_for(model) -> list[Plan]:
    """Every bundled plan whose `models` names the model's class, in name order.

    A class may have variants for degrees its first plan cannot do: `clip` shards CLIP's attention
    (12 heads: tp in {1, 2, 4}), `clip-mlp` keeps it whole (any tp dividing 1024). A variant is named
    `<first>-<suffix>` so that it sorts after the first plan, which `plan_for` returns.
    """
    plans = (load_plan(name) for name in bundled_plan_names())
    return [plan for plan in plans if type(model).__name__ in plan.models]


def find_plan(model) -> Plan | None:
    """The bundled plan whose `models` names the model's class, else the model's own plan, else None.

    The model's own plan depends on its library, read from its class: a transformers PreTrainedModel's
    `_tp_plan` / `base_model_tp_plan` are translated from transformers' vocabulary (`transformers.py`;
    PlanError for a style dtp cannot do exactly); a diffusers model's `_tp_plan` (and `_cp_plan`) is
    read as is. Any other class has no plan of its own, whatever its attributes.
    """
    cls_name = type(model).__name__
    bundled = bundled_plans_for(model)
    if bundled:
        return bundled[0]
    if is_transformers_model(model):
        return transformers_plan(model)
    tp_plan = getattr(type(model), "_tp_plan", None) if is_diffusers_model(model) else None
    if not tp_plan:
        return None
    # The class's `_cp_plan` (ContextParallelInput/Output objects) comes along as the `cp` section.
    cp_plan = getattr(type(model), "_cp_plan", None)
    return Plan.from_dict({"tp": tp_plan, "cp": cp_plan or None}, name=f"{cls_name}._tp_plan")
