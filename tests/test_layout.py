"""The package's layout: imports run one way through the stages of the pipeline, each folder one
stage, nothing too large to read (docs/architecture.md draws the tree these rules keep)."""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "numpyro_lm")

# lowest first: a module imports from its own stage or the stages before it, never after
STAGES = ["runtime", "curvature", "mode", "families", "core", "marginal", "posterior", "checks", "samplers",
          "approximations", "contrib", ""]  # "": the top level (the facade, ArviZ, plots, compare, sbc)
MAX_ROOT_MODULES = 10
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80


def _modules() -> dict:
    """``{dotted name: (path, syntax tree)}`` of every module of the package."""
    out = {}
    root = os.path.dirname(PACKAGE)
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                dotted = dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted
                with open(path) as f:
                    out[dotted] = (path, ast.parse(f.read()))
    return out


MODULES = _modules()


def _imports(name: str):
    """``(line, imported module, imported name or None)`` for each import of the package by
    module ``name``, at any depth (function-local imports count)."""
    path, tree = MODULES[name]
    package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "numpyro_lm":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield node.lineno, (sub if sub in MODULES else target), (None if sub in MODULES else alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "numpyro_lm":
                    yield node.lineno, alias.name, None


def _stage(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else ""


def _graph() -> dict:
    return {m: {target for _, target, _ in _imports(m) if target != m} for m in MODULES}


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_stages_are_the_folders():
    folders = sorted(d for d in os.listdir(PACKAGE) if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py")))
    assert folders == sorted(s for s in STAGES if s)


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_imports_run_one_way_through_the_stages():
    wrong = []
    for name in MODULES:
        here = STAGES.index(_stage(name))
        for line, target, _ in _imports(name):
            if STAGES.index(_stage(target)) > here:
                wrong.append(f"{name}:{line} imports {target}")
    assert wrong == []


def test_the_core_imports_nothing_from_the_applications():
    assert [f"{m} imports {t}" for m, targets in _graph().items() if _stage(m) != "contrib"
            for t in targets if _stage(t) == "contrib"] == []


def test_no_private_name_is_imported_from_another_module():
    private = [f"{name}:{line} imports {target}.{what}" for name in MODULES for line, target, what in _imports(name)
               if what and what.startswith("_") and not what.startswith("__")]
    assert private == []


def test_no_function_local_import_of_the_package():
    """An import inside a function hides a dependency (it was how cycles were dodged)."""
    local = []
    for name, (_, tree) in MODULES.items():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("numpyro_lm")):
                        local.append(f"{name}:{node.lineno}")
    assert local == []


def test_few_modules_at_the_root():
    root = [f for f in os.listdir(PACKAGE) if f.endswith(".py")]
    assert len(root) <= MAX_ROOT_MODULES, sorted(root)


@pytest.mark.parametrize("kind, limit", [(ast.ClassDef, MAX_CLASS_LINES), (ast.FunctionDef, MAX_FUNCTION_LINES)])
def test_nothing_too_long_to_read(kind, limit):
    long = [f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)" for name, (_, tree) in MODULES.items()
            for node in ast.walk(tree) if isinstance(node, kind) and node.end_lineno - node.lineno + 1 > limit]
    assert long == []


def test_the_rules_can_fail():
    """The checks above see what they look for: a cycle, and a downward import."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _stage("numpyro_lm.core.trace") == "core" and _stage("numpyro_lm.matching") == ""
    assert _stage("numpyro_lm.contrib.gp.model") == "contrib"


OLD_PATHS_SCRIPT = """
import importlib, json, warnings
import numpyro_lm
from numpyro_lm.contrib import bridge
from numpyro_lm.moved import OLD_MODULES

out = {}
for name in sorted(OLD_MODULES):  # a parent before its children: each warns once, when first imported
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    main = importlib.import_module(OLD_MODULES[name][0])
    out[name] = [[str(w.message) for w in caught if w.category is FutureWarning],
                 all(getattr(module, n) is getattr(main, n) for n in getattr(main, "__all__", []))]
from numpyro_lm.optimize import hvp, lbfgs  # names that went to different modules
out["split"] = [hvp.__module__, lbfgs.__module__, importlib.import_module("numpyro_lm.bridge") is bridge]
try:
    importlib.import_module("numpyro_lm.laplace")  # numpyro_lm.laplace is the function
except ModuleNotFoundError as error:
    out["laplace"] = str(error)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_flat_layouts_import_paths_still_work_and_name_the_new_place():
    """In a fresh interpreter (a module warns once, when it is first imported): every old path
    imports, warns naming where it went, and gives the same objects as the new place."""
    import json
    import subprocess
    import sys

    from numpyro_lm.moved import OLD_MODULES

    done = subprocess.run([sys.executable, "-c", OLD_PATHS_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name, targets in OLD_MODULES.items():
        messages, same = out[name]
        assert len(messages) == 1 and messages[0].startswith(f"{name} moved to {targets[0]}"), (name, messages)
        assert same, name
    assert out["split"] == ["numpyro_lm.mode.derivatives", "numpyro_lm.mode.lbfgs", True]
    assert "numpyro_lm.mode.laplace_state" in out["laplace"]
