"""The house rules of ``tfmcu/``, ``benchmarks/`` and ``pipelines/``, checked on the source (no module is imported):

* the import graph, function-level imports included, has no cycle;
* the library never imports the measurements or the shells above it (``tfmcu`` imports neither ``benchmarks`` nor
  ``pipelines``; ``benchmarks`` does not import ``pipelines``);
* no module imports another module's underscore names (``from x import _y``, or ``x._y`` on an imported module);
* an import inside a function is only for a heavy optional dependency (``LAZY`` below, each with its reason), or for
  a tfmcu module that imports one at its top level, marked on its line with ``# lazy: <reason>``;
* ``pipelines/*.py`` are thin: flag definitions and a ``main`` that calls the library (no other functions), and the
  flags several pipelines share are defined once, in ``pipelines/_cli.py``.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tfmcu", "benchmarks", "pipelines")  # bottom to top: each imports only those before it

# Heavy optional dependencies a function may import lazily, and why.
LAZY = {
    "tensorflow": "TensorFlow takes seconds to import; analysis, planning and rewriting never need it",
    "tf_keras": "imports TensorFlow",
    "tensorflow_model_optimization": "imports TensorFlow (QAT only)",
    "tensorflow_lite_support": "TFLite Support metadata writers (export only)",
    "matplotlib": "plots only",
    "PIL": "image folders only",
    "tflite_micro.python.tflite_micro": "loads the TFLM interpreter's shared library (running models only)",
}


@dataclass
class Module:
    name: str
    path: str
    tree: ast.Module
    lines: list[str]
    top_imports: set[str] = field(default_factory=set)  # modules imported at module level (any package)
    edges: set[str] = field(default_factory=set)  # tfmcu / pipelines modules imported anywhere


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def load_modules() -> dict[str, Module]:
    mods = {}
    for pkg in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    text = open(path).read()
                    mods[_module_name(path)] = Module(_module_name(path), path, ast.parse(text), text.splitlines())
    return mods


def _imports(node: ast.AST) -> list[tuple[ast.stmt, str, list[str]]]:
    """(statement, imported module, names imported from it) for every import under ``node``."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            out += [(n, a.name, []) for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out.append((n, n.module, [a.name for a in n.names]))
    return out


def _targets(mods: dict[str, Module], module: str, names: list[str]) -> set[str]:
    """The project modules an import statement depends on: ``from pkg import sub`` is the submodule ``pkg.sub``;
    ``from mod import name`` is ``mod``."""
    out = set()
    for n in names:
        if f"{module}.{n}" in mods:
            out.add(f"{module}.{n}")
        elif module in mods:
            out.add(module)
    if not names and module in mods:
        out.add(module)
    return out


def _function_imports(tree: ast.Module) -> list[tuple[ast.stmt, str, list[str]]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in node.body:
                found += _imports(stmt)
    return list({id(s): (s, m, n) for s, m, n in found}.values())


def analyse() -> dict[str, Module]:
    mods = load_modules()
    for m in mods.values():
        for stmt in m.tree.body:
            for _, module, _ in _imports(stmt):
                m.top_imports.add(module)
        for _, module, names in _imports(m.tree):
            m.edges |= _targets(mods, module, names) - {m.name}
    return mods


def _cycles(mods: dict[str, Module]) -> list[list[str]]:
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(mods[v].edges):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return out


def _heavy(mods: dict[str, Module], name: str, seen: set[str] | None = None) -> bool:
    """Whether importing project module ``name`` imports a LAZY dependency at module level (transitively)."""
    seen = seen if seen is not None else set()
    if name in seen or name not in mods:
        return False
    seen.add(name)
    for imp in mods[name].top_imports:
        if any(imp == h or imp.startswith(h + ".") for h in LAZY):
            return True
        if any(_heavy(mods, t, seen) for t in _targets(mods, imp, [])) or _heavy(mods, imp, seen):
            return True
    return False


def test_import_graph_has_no_cycle():
    mods = analyse()
    assert len(mods) > 40, sorted(mods)  # the whole tree was read
    cycles = _cycles(mods)
    assert not cycles, f"import cycles: {cycles}"


def test_no_package_imports_one_above_it():
    mods = analyse()
    assert any(name.startswith("benchmarks.") for name in mods), sorted(mods)
    problems = [f"{m.name} imports {t}" for m in mods.values() for t in sorted(m.edges)
                if PACKAGES.index(t.split(".")[0]) > PACKAGES.index(m.name.split(".")[0])]
    assert not problems, problems


def test_the_checker_finds_cycles():
    """The cycle finder itself: a two-module cycle hidden in a function-level import is reported."""
    a = Module("a", "a.py", ast.parse("import b\n"), [])
    b = Module("b", "b.py", ast.parse("def f():\n    import a\n"), [])
    mods = {"a": a, "b": b}
    for m in mods.values():
        for _, module, names in _imports(m.tree):
            m.edges |= _targets(mods, module, names) - {m.name}
    assert _cycles(mods) == [["a", "b"]]


def test_no_module_imports_another_modules_private_names():
    mods = analyse()
    problems = []
    for m in mods.values():
        aliases = {}
        for stmt, module, names in _imports(m.tree):
            if module.split(".")[0] not in PACKAGES:
                continue
            for alias in stmt.names:
                own_submodule = f"{module}.{alias.name}" in mods and module == m.name.rpartition(".")[0]
                if (isinstance(stmt, ast.ImportFrom) and alias.name.startswith("_") and not alias.name.startswith("__")
                        and not own_submodule):  # a package's private module is its own package's to use
                    problems.append(f"{m.name}: from {module} import {alias.name}")
                if isinstance(stmt, ast.ImportFrom) and f"{module}.{alias.name}" in mods:
                    aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
                elif isinstance(stmt, ast.Import) and alias.asname:
                    aliases[alias.asname] = module
        for node in ast.walk(m.tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                problems.append(f"{m.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not problems, problems


def test_function_level_imports_are_heavy_dependencies_with_a_reason():
    mods = analyse()
    problems = []
    for m in mods.values():
        for stmt, module, names in _function_imports(m.tree):
            line = m.lines[stmt.lineno - 1]
            if any(module == h or module.startswith(h + ".") for h in LAZY):
                continue
            targets = _targets(mods, module, names)
            if targets and all(_heavy(mods, t) for t in targets):
                if not re.search(r"#\s*lazy:\s*\S", line):
                    problems.append(f"{m.name}:{stmt.lineno}: lazy import of {module} needs '# lazy: <reason>'")
                continue
            problems.append(f"{m.name}:{stmt.lineno}: '{line.strip()}' inside a function: import it at the top "
                            f"(only heavy optional dependencies are imported lazily: {', '.join(LAZY)})")
    assert not problems, "\n".join(problems)


def test_pipelines_are_flag_definitions_and_a_main():
    mods = analyse()
    problems = []
    defined: dict[str, list[str]] = {}
    for name, m in mods.items():
        if not name.startswith("pipelines.") or name == "pipelines._cli":
            continue
        funcs = [n.name for n in m.tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        if funcs != ["main"]:
            problems.append(f"{name}: defines {funcs}; a pipeline is flags + main (the work is in the library)")
        for node in ast.walk(m.tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith(
                    "DEFINE_") and node.args and isinstance(node.args[0], ast.Constant)):
                defined.setdefault(node.args[0].value, []).append(name)
    twice = {flag: where for flag, where in defined.items() if len(where) > 1}
    assert not problems, problems
    assert not twice, f"flags defined in several pipelines (define them once in pipelines/_cli.py): {twice}"
