"""The package's architecture holds: no import cycle, layers import only downwards, no private names across modules."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dtp"

# Each layer may import itself and the layers listed before it (see dtp/__init__.py).
LAYERS = [
    "errors",
    "policy",
    "plan",
    "resolve",
    "runtime",
    "engine",
    "parallelize",
    "vae",
    "loading",
    "pipeline",
    "adapters",
    "models",
    "testing",
    "tools",
]
TOP = {"__init__", "__main__"}  # the package facade imports everything; `python -m dtp` runs the CLI


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, imported names) for every dtp import in `path`, relative ones resolved."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "dtp":
                found.append((target, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] == "dtp"]
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for target, names in imports(path):
            # `from .x import y` where y is a submodule counts as importing dtp....x.y
            targets |= {f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names} or {target}
        edges[name] = {t for t in targets if t in modules and t != name}
    return edges


def layer(module: str) -> int | None:
    parts = module.split(".")
    return None if len(parts) < 2 or parts[1] in TOP else LAYERS.index(parts[1])


def test_no_import_cycle():
    edges, state = graph(), {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            assert state.get(nxt) != "open", f"import cycle: {' -> '.join(stack + [node, nxt])}"
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])


def test_layers_import_only_downwards():
    bad = [
        f"{src} imports {dst}"
        for src, targets in graph().items()
        for dst in targets
        if layer(src) is not None and layer(dst) is not None and layer(dst) > layer(src)
    ]
    assert not bad, bad


def test_no_private_name_is_imported_from_another_module():
    bad = [
        f"{module_name(path)} imports {name} from {target}"
        for path in ROOT.rglob("*.py")
        for target, names in imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not bad, bad


def test_every_layer_folder_exists():
    """A newcomer finds each layer by name in the tree."""
    for name in LAYERS:
        assert (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file(), name
