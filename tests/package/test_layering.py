"""The Python package has no import circles.

Every module of python/torch_npu is parsed (``ast``, nothing is imported) and every
import of a torch_npu module is an edge of the graph: module-level imports and those
inside functions alike (a function-level import that only hides a circle is still
one), ``from . import name`` (an edge to the submodule ``name`` where one exists, else
to the package whose attribute it reads) and ``importlib.import_module("...")`` /
``__import__("...")`` with a literal name. Importing a submodule imports its parent
packages too; those implicit edges are not counted (every module would otherwise sit
in a circle with ``torch_npu/__init__.py``), so an explicit import of a package's
``__init__`` from below it is what closes a circle.

A failure prints each circle with the lines that make it.
"""
import ast
import pathlib
import sys
from typing import Dict, List, Optional, Set, Tuple

PACKAGE = "torch_npu"
PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[2] / "python" / PACKAGE

Edge = Tuple[str, str, str]   # (target module, "path:line", "module level" or "in a function")


def _modules(root: pathlib.Path = PACKAGE_DIR) -> Dict[str, pathlib.Path]:
    """Every module of the package by dotted name (a package by its name: its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    for path in root.glob("_C.*"):   # the C++ extension: a module that imports no Python module
        found[f"{PACKAGE}._C"] = path
    return found


def _nearest(name: str, modules) -> Optional[str]:
    """``name`` or its nearest enclosing module that exists (an attribute path: its module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _base_package(module: str, path: pathlib.Path, level: int) -> str:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


def _literal_import(call: ast.Call) -> Optional[str]:
    """The module named by ``importlib.import_module("x")`` or ``__import__("x")``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
        return first.value
    return None


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, path: pathlib.Path, modules, root: pathlib.Path):
        self.module, self.path, self.modules, self.root = module, path, modules, root
        self.depth = 0
        self.edges: List[Edge] = []

    def _add(self, target: Optional[str], node: ast.AST):
        if target is None or target == self.module or not (target == PACKAGE or target.startswith(PACKAGE + ".")):
            return
        where = f"{self.path.relative_to(self.root.parent)}:{node.lineno}"
        self.edges.append((target, where, "in a function" if self.depth else "module level"))

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            self._add(_nearest(alias.name, self.modules), node)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.level:
            base = _base_package(self.module, self.path, node.level)
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            self._add(submodule if submodule in self.modules else _nearest(source, self.modules), node)

    def visit_Call(self, node: ast.Call):
        name = _literal_import(node)
        if name is not None:
            self._add(_nearest(name, self.modules), node)
        self.generic_visit(node)


def import_graph(root: pathlib.Path = PACKAGE_DIR) -> Dict[str, List[Edge]]:
    """{module: [(imported module, where, how)]} for every module of the package."""
    modules = _modules(root)
    graph = {}
    for module, path in modules.items():
        if path.suffix != ".py":
            graph[module] = []
            continue
        visitor = _Imports(module, path, modules, root)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        graph[module] = visitor.edges
    return graph


def _strongly_connected(graph: Dict[str, List[Edge]]) -> List[List[str]]:
    """Tarjan's components of more than one module (or with a self-loop), iteratively."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    components = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted({t for t, _, _ in graph[start]})))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted({t for t, _, _ in graph.get(succ, ())}))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _cycle_in(component: List[str], graph: Dict[str, List[Edge]]) -> List[str]:
    """One circle through the component's first module (depth-first, within the component)."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}

    def search(node):
        for target in sorted({t for t, _, _ in graph[node]}):
            if target == start:
                return True
            if target in members and target not in seen:
                seen.add(target)
                path.append(target)
                if search(target):
                    return True
                path.pop()
        return False

    search(start)
    return path + [start]


def cycles(graph: Dict[str, List[Edge]]) -> List[List[str]]:
    """One circle per group of modules that import each other (a strongly connected component)."""
    return [_cycle_in(component, graph) for component in _strongly_connected(graph)]


def describe(cycle: List[str], graph: Dict[str, List[Edge]]) -> str:
    """The circle, then every import between the modules of its group (the modules that
    import each other through it), each once."""
    members = set(_members(cycle, graph))
    lines = [" -> ".join(cycle)]
    for source in sorted(members):
        for imported, where, how in sorted(set(graph[source])):
            if imported in members:
                lines.append(f"    {source} imports {imported} at {where} ({how})")
    return "\n".join(lines)


def _members(cycle: List[str], graph: Dict[str, List[Edge]]) -> List[str]:
    return next(c for c in _strongly_connected(graph) if cycle[0] in c)


def test_the_package_has_no_import_circles():
    graph = import_graph()
    assert len(graph) > 40, sorted(graph)   # the package was found and parsed
    found = cycles(graph)
    report = "\n".join(describe(c, graph) for c in found)
    print(report)
    assert not found, f"{len(found)} group(s) of modules importing each other in python/torch_npu:\n{report}"


# The levels of the package, lowest first (docs: the architecture's "Python imports run one
# way"). A module imports modules of its own level or below; a package's level is its
# modules'. The package's __init__ and _core.bootstrap, which install everything, sit just
# below the doctor, the application on top.
LEVELS = (
    ("torch_npu._C",),                                   # the C++ extension
    ("torch_npu._core",),                                # the ledger, ASCEND_* names, exit, version
    ("torch_npu._emu",),                                 # the emulated chips
    ("torch_npu.npu",),                                  # torch.npu, as torch.cuda
    ("torch_npu.fallback", "torch_npu.ops"),             # the CPU fallback; the npu ops' Python face
    ("torch_npu._compile", "torch_npu.profiler", "torch_npu.distributed", "torch_npu.optim", "torch_npu.utils"),
    ("torch_npu.contrib",),                              # transfer_to_npu
    ("torch_npu", "torch_npu._core.bootstrap"),          # installs the rest, in order
    ("torch_npu.doctor",),
)
# Imports that reach up, each with why it is allowed.
UPWARD = {
    ("torch_npu.npu.utils", "torch_npu.utils.collect_env"):
        "torch.npu.utils.get_cann_version reads the toolkit version at the Ascend adapter's public path, a "
        "module of the standard library only; imported when called",
}


def level(module: str) -> Optional[int]:
    """The index in LEVELS of ``module``'s longest matching entry."""
    best, length = None, -1
    for index, entries in enumerate(LEVELS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > length:
                best, length = index, len(entry)
    return best


def test_imports_run_down_the_levels():
    graph = import_graph()
    unplaced = sorted(m for m in graph if level(m) is None)
    assert not unplaced, f"modules of no level (add them to LEVELS): {unplaced}"
    upward = sorted({f"{source} (level {level(source)}) imports {target} (level {level(target)}) at {where}"
                     for source, edges in graph.items() for target, where, _ in edges
                     if level(target) > level(source) and (source, target) not in UPWARD})
    assert not upward, "imports that reach up a level:\n" + "\n".join(upward)
    assert all(any(t == target for t, _, _ in graph[source]) for source, target in UPWARD), \
        "an allowed upward import is gone: remove it from UPWARD"


def test_the_checker_finds_circles(tmp_path):
    """A module-level circle and one hidden in a function are both found; a one-way package is not."""
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\nfrom .sub import c\n")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .a import thing\n")   # hidden in a function
    (package / "sub" / "__init__.py").write_text("")
    (package / "_C.so").write_bytes(b"")   # the extension: imports nothing
    (package / "sub" / "c.py").write_text("import importlib\nimportlib.import_module('torch_npu.sub.d')\n")
    (package / "sub" / "d.py").write_text("from .. import a\nfrom torch_npu import _C\n")
    graph = import_graph(package)
    assert cycles(graph) == [["torch_npu.a", "torch_npu.b", "torch_npu.a"]], cycles(graph)
    assert "(in a function)" in describe(cycles(graph)[0], graph)
    (package / "b.py").write_text("def f():\n    import torch_npu\n")   # up to the package's __init__
    assert cycles(import_graph(package)) == [["torch_npu", "torch_npu.a", "torch_npu.b", "torch_npu"]]


if __name__ == "__main__":
    graph = import_graph()
    edges = sum(len(e) for e in graph.values())
    print(f"{len(graph)} modules, {edges} internal import edges")
    found = cycles(graph)
    for c in found:
        print(describe(c, graph))
    sys.exit(1 if found else 0)
