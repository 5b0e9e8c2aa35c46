"""A plain (non-editable) install must ship every subpackage: pyproject lists them by hand."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "dtp").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages"
    assert "dtp.plans" in listed and config["package-dir"]["dtp.plans"] == "plans"


def test_test_module_basenames_are_unique():
    """pytest imports test modules by basename (no __init__.py): two with one name break the whole suite."""
    names = [p.name for p in (ROOT / "tests").rglob("*.py") if p.name != "__init__.py"]
    assert sorted({n for n in names if names.count(n) > 1}) == []
