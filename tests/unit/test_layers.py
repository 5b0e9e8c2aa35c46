"""The package's architecture holds: an explicit map of which package may import which, no import cycle,
no private name or private module attribute used across modules, no `importlib` detour around the map.

Each check is a function of a source root that returns its violations, so the last test plants one
violation of each kind in a throwaway tree and watches every check catch it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dtp"

# What each package (a top-level module or folder of dtp) may import, besides itself. Read it as the
# architecture: data flows styles -> plan -> resolve -> runtime -> engine; loading, pipelines and adapters sit on
# the engine; families are leaf data; analysis is the library behind the CLI; tools only parse and print.
ALLOWED = {
    "errors": set(),
    "policy": {"errors"},
    "quant": {"errors", "policy"},
    "styles": {"errors", "policy", "quant"},
    "plan": {"errors", "policy", "styles", "quant"},
    "resolve": {"errors", "policy", "plan", "styles", "quant", "families"},
    "runtime": {"errors", "policy", "plan", "styles", "quant", "resolve", "families", "neighbours"},
    "cache": {"errors", "policy", "runtime"},
    "engine": {"errors", "policy", "plan", "styles", "quant", "resolve", "runtime", "families", "cache"},
    "parallelize": {"errors", "policy", "plan", "styles", "quant", "resolve", "runtime", "engine", "cache", "families"},
    "loading": {"errors", "policy", "plan", "styles", "quant", "resolve", "runtime", "engine", "cache", "families"},
    "pipeline": {
        "errors",
        "policy",
        "plan",
        "styles",
        "quant",
        "resolve",
        "runtime",
        "engine",
        "cache",
        "loading",
        "families",
        "vae",
        "adapters",  # a pipeline session loads LoRAs by name (pipeline/session.py)
    },
    "adapters": {"errors", "policy", "plan", "styles", "quant", "resolve", "runtime", "engine", "cache", "families"},
    "families": {"errors"},
    "vae": {"errors", "policy", "neighbours"},
    "neighbours": {"errors"},  # the halo-row exchange of the parallel VAE and of CP's token-grid convolutions
    "analysis": {
        "errors",
        "policy",
        "plan",
        "styles",
        "quant",
        "resolve",
        "runtime",
        "engine",
        "cache",
        "loading",
        "pipeline",
        "families",
    },
    "fit": {
        "errors",
        "policy",
        "plan",
        "styles",
        "quant",
        "resolve",
        "runtime",
        "engine",
        "cache",
        "loading",
        "pipeline",
        "families",
        "analysis",
        "vae",
    },
    "testing": {
        "errors",
        "policy",
        "plan",
        "styles",
        "quant",
        "resolve",
        "runtime",
        "engine",
        "cache",
        "parallelize",
        "families",
        "analysis",
        "vae",
    },
    "tools": {
        "errors",
        "policy",
        "plan",
        "styles",
        "quant",
        "resolve",
        "runtime",
        "engine",
        "cache",
        "parallelize",
        "loading",
        "pipeline",
        "adapters",
        "families",
        "analysis",
        "fit",
        "vae",
    },
}
# Inside dtp/resolve the same rule, one level down: the slicing math at the bottom, the plan bound to the shapes on
# it, then the exact rewrites (padding, shared kv heads) and the forward-running checks, which may use both below.
RESOLVE_ALLOWED = {
    "layout": set(),
    "binding": {"layout"},
    "transforms": {"layout", "binding"},
    "exactness": {"layout", "binding", "transforms"},
}
for _targets in ALLOWED.values():  # the torch-free values the parsers show (dtp/choices.py): every package reads them
    _targets.add("choices")
ALLOWED["choices"] = set()
ALLOWED["serve"] = set(ALLOWED["tools"])  # the HTTP server: a front end like the CLI
ALLOWED["tools"].add("serve")
FACADE = {"__init__", "__main__"}  # the package facade exports everything; `python -m dtp` runs the CLI


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path) -> list[tuple[str, list[str]]]:
    """(imported module, imported names) for every import of the root package in `path`, relative ones resolved."""
    top = root.name
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == top:
                found.append((target, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] == top]
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for target, names in imports(path, root):
            # `from .x import y` where y is a submodule counts as importing <root>.x.y
            targets |= {f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names} or {target}
        edges[name] = {t for t in targets if t in modules and t != name}
    return edges


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return None if len(parts) < 2 or parts[1] in FACADE else parts[1]


def cycles(root: Path = ROOT) -> list[str]:
    edges, state, found = graph(root), {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append(" -> ".join(stack + [node, nxt]))
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def map_violations(root: Path = ROOT, allowed: dict = ALLOWED) -> list[str]:
    """Imports the map does not allow, and packages the map does not know."""
    bad = []
    for src, targets in graph(root).items():
        src_pkg = package_of(src)
        if src_pkg is None:
            continue
        if src_pkg not in allowed:
            bad.append(f"{src}: package '{src_pkg}' is not in the ALLOWED map")
            continue
        bad += [
            f"{src} imports {dst} ('{src_pkg}' may import {sorted(allowed[src_pkg])})"
            for dst in sorted(targets)
            if package_of(dst) not in (None, src_pkg) and package_of(dst) not in allowed[src_pkg]
        ]
    return bad


def subpackage_violations(root: Path = ROOT, package: str = "resolve", allowed: dict = RESOLVE_ALLOWED) -> list[str]:
    """Imports between the parts of `package` (its subfolders and top-level modules) that `allowed` does not list."""
    prefix = f"{root.name}.{package}."

    def part(module: str) -> str | None:
        return module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None

    bad = []
    for src, targets in graph(root).items():
        src_part = part(src)
        if src_part is None:
            continue
        if src_part not in allowed:
            bad.append(f"{src}: part '{src_part}' of {package} is not in its map")
            continue
        bad += [
            f"{src} imports {dst} ('{src_part}' may import {sorted(allowed[src_part])})"
            for dst in sorted(targets)
            if part(dst) not in (None, src_part) and part(dst) not in allowed[src_part]
        ]
    return bad


def private_imports(root: Path = ROOT) -> list[str]:
    return [
        f"{module_name(path, root)} imports {name} from {target}"
        for path in root.rglob("*.py")
        for target, names in imports(path, root)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]


def _module_aliases(tree: ast.AST, path: Path, root: Path) -> set[str]:
    """Local names bound to modules of the root package (`import dtp.x as y`, `from . import x`)."""
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == root.name}
    for target, names in imports(path, root):
        aliases |= {n for n in names if f"{target}.{n}" in modules}
    return aliases


def private_attributes(root: Path = ROOT) -> list[str]:
    """`module._name` where `module` is another module of the root package: a private name used across modules."""
    bad = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = _module_aliases(tree, path, root)
        bad += [
            f"{module_name(path, root)}:{node.lineno} uses {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ]
    return bad


def importlib_detours(root: Path = ROOT) -> list[str]:
    """`importlib.import_module(...)` / `__import__(...)` of the root package's own modules (a way around the map).

    Importing a third-party library lazily this way is fine; naming one of our modules is not. The package
    facade (`__init__.py` of the root: it may import everything) exports its names lazily this way.
    """
    bad = []
    for path in root.rglob("*.py"):
        if path == root / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called not in ("import_module", "__import__"):
                continue
            arg = node.args[0]
            own = not isinstance(arg, ast.Constant) or str(arg.value).split(".")[0] in (root.name, "")
            if own:
                bad.append(f"{module_name(path, root)}:{node.lineno} imports through {called}(...)")
    return bad


def test_no_import_cycle():
    assert not cycles(), cycles()


def test_imports_follow_the_allowed_map():
    assert not map_violations(), map_violations()


def test_resolve_parts_follow_their_map():
    assert not subpackage_violations(), subpackage_violations()


def test_the_resolve_map_catches_a_planted_upward_import(tmp_path):
    """A throwaway `pkg.resolve` whose binding imports its exactness checks: reported; the reverse is fine."""
    for folder in ("binding", "exactness"):
        (tmp_path / "pkg" / "resolve" / folder).mkdir(parents=True)
        (tmp_path / "pkg" / "resolve" / folder / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "resolve" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "resolve" / "binding" / "heads.py").write_text("from ..exactness import flow\n")
    (tmp_path / "pkg" / "resolve" / "exactness" / "flow.py").write_text("from ..binding import heads\n")
    assert subpackage_violations(tmp_path / "pkg") == [
        "pkg.resolve.binding.heads imports pkg.resolve.exactness.flow ('binding' may import ['layout'])"
    ]


def test_the_map_is_a_partial_order():
    """Nobody may import a package that may import them back (directly or through others)."""

    def reach(pkg, seen=()):
        return {d for dep in ALLOWED[pkg] if dep not in seen for d in {dep} | reach(dep, (*seen, dep))}

    assert all(pkg not in reach(pkg) for pkg in ALLOWED)


def test_no_private_name_is_imported_from_another_module():
    assert not private_imports(), private_imports()


def test_no_private_attribute_of_another_module():
    assert not private_attributes(), private_attributes()


def test_no_importlib_detour():
    assert not importlib_detours(), importlib_detours()


def test_every_package_exists():
    """A newcomer finds each package of the map by name in the tree."""
    for name in ALLOWED:
        assert (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file(), name


def test_each_check_catches_a_planted_violation(tmp_path):
    """A throwaway package `pkg` with one violation of each kind: every check reports it."""
    root = tmp_path / "pkg"
    for folder in ("errors", "families", "engine"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "errors" / "core.py").write_text("from ..families import data\n_hidden = 1\n")
    (root / "families" / "data.py").write_text(
        "from ..engine import run\nfrom ..errors.core import _hidden\nfrom ..errors import core\n"
        "x = core._hidden\nimport importlib\nimportlib.import_module('pkg.engine.run')\n"
    )
    (root / "engine" / "run.py").write_text("from ..errors import core\n")
    allowed = {"errors": set(), "families": {"errors"}, "engine": {"errors", "families"}}
    assert any("pkg.families.data imports pkg.engine.run" in v for v in map_violations(root, allowed))
    assert any("pkg.errors.core -> pkg.families.data" in c for c in cycles(root))
    assert private_imports(root) == ["pkg.families.data imports _hidden from pkg.errors.core"]
    assert [v.split(" uses ")[1] for v in private_attributes(root)] == ["core._hidden"]
    assert len(importlib_detours(root)) == 1
