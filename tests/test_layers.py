"""The import structure: packages import only their own layer or the ones below it, and no
module imports itself back through others (every import counts, those inside functions too).

Layers, bottom to top (ARCHITECTURE in the README): the leaves ``profiling.nvtx`` and
``profiling.cuda_toolkit`` (importing no other gemmlab module); ``backends``; ``tp``; the rest of
``profiling``; ``bench``.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("backends", "tp", "profiling", "bench")
LEAVES = ("profiling.nvtx", "profiling.cuda_toolkit")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The gemmlab modules ``name`` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # "from p import x": the module p.x when x is one (p is then only its package,
            # initialised before any of its modules), else p itself
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # "import a.b.c" -> the module part
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> int:
    if name in LEAVES:
        return 0
    top = name.split(".")[0]
    return {"backends": 1, "tp": 2, "profiling": 3, "bench": 4}[top]


def test_the_walk_sees_the_packages():
    assert {"backends.api", "tp.layers", "bench.cli", "profiling.nvtx"} <= set(MODULES)
    assert "backends.api" in GRAPH["tp.layers"] or "backends" in GRAPH["tp.layers"]


def test_leaves_import_only_leaves():
    for leaf in LEAVES:
        assert GRAPH[leaf] <= set(LEAVES), f"{leaf} imports {sorted(GRAPH[leaf])}"


def test_no_package_imports_a_layer_above_it():
    upward = sorted((name, target) for name, targets in GRAPH.items() for target in targets
                    if _layer(target) > _layer(name))
    assert upward == [], "imports up the layers: " + ", ".join(f"{a} -> {b}" for a, b in upward)


def test_no_import_cycles():
    # Tarjan's strongly connected components; any component of 2+ modules is a cycle.
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"
