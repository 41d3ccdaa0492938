"""The torchrpc package's import graph has no cycle, counting imports inside
functions too, and no module assigns another module's globals: each module
sits on the ones below it. Static (ast), so it needs no build."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "torchrpc"
MAX_LINES = 500
NATIVE = {"torchrpc._C"}  # built from csrc/: imports no Python module of the package


def _module_name(path, root):
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root):
    """{module name: (path, ast)} of every .py file under root."""
    return {_module_name(p, root): (p, ast.parse(p.read_text(), str(p))) for p in sorted(root.rglob("*.py"))}


def _from_base(node, name, is_package):
    """The absolute module an ImportFrom node in module `name` imports from."""
    base = node.module or ""
    if node.level:  # relative: from the package that holds `name`
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return base


def _imported(node, name, is_package, known):
    """The package modules an Import or ImportFrom node in module `name` loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    base = _from_base(node, name, is_package)
    found = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in NATIVE:
            continue
        if submodule in known:
            found.append(submodule)  # from torchrpc import state
        elif base in known:
            found.append(base)  # from torchrpc.state import WorkerInfo
    return found


def import_graph(root=PACKAGE):
    """{module: set of package modules it imports anywhere in its body}."""
    modules = _modules(root)
    graph = {}
    for name, (path, tree) in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_imported(node, name, is_package, modules))
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    on_path, done = [], set()

    def visit(module):
        if module in on_path:
            return on_path[on_path.index(module):] + [module]
        if module in done:
            return None
        on_path.append(module)
        for dep in sorted(graph.get(module, ())):
            cycle = visit(dep)
            if cycle:
                return cycle
        on_path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return None


def foreign_global_assignments(root=PACKAGE):
    """'module:line target' for each assignment to an attribute of another
    package module bound by an import (``python_fallback._x = ...``)."""
    modules = _modules(root)
    found = []
    for name, (path, tree) in modules.items():
        bound = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound.update(a.asname or a.name.split(".")[0] for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, name, path.name == "__init__.py")
                bound.update(a.asname or a.name for a in node.names if f"{base}.{a.name}" in modules)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    owner = target.value
                    while isinstance(owner, ast.Attribute):
                        owner = owner.value
                    if isinstance(owner, ast.Name) and owner.id in bound:
                        found.append(f"{name}:{node.lineno} {ast.unparse(target)}")
    return found


def test_no_import_cycle():
    graph = import_graph()
    assert "torchrpc.state" in graph and "torchrpc.api" in graph, sorted(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in torchrpc/: " + " -> ".join(cycle)


def test_no_module_assigns_another_modules_globals():
    assert foreign_global_assignments() == []


def test_modules_stay_short():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_the_checks_see_a_cycle_and_a_foreign_assignment(tmp_path):
    pkg = tmp_path / "torchrpc"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from torchrpc import a\n")
    (pkg / "a.py").write_text("from torchrpc import b\n")
    (pkg / "b.py").write_text("def f():\n    from torchrpc.sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\na.x = 1\n")
    assert find_cycle(import_graph(pkg)) == ["torchrpc.a", "torchrpc.b", "torchrpc.sub.c", "torchrpc.a"]
    assert foreign_global_assignments(pkg) == ["torchrpc.sub.c:2 a.x"]
