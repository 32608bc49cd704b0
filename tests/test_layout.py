"""The package's shape: folders that say what they own, layers that import only downward and
no import circle, TensorFlow-free layers that stay so, and no module that changes process
settings when it is imported (no training)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SRC = ROOT / "src" / "distlab"
FOLDERS = ["components", "config", "config/schema", "data", "distribute", "keras_patches", "launch",
           "records", "reporting", "tracking", "training", "training/actions", "training/loops",
           "verification"]


# The layers, bottom up, as src/distlab/__init__.py's docstring lists them: a module of the
# package (a top-level module, or a folder's) belongs to the layer naming it; "" is the package
# itself (src/distlab/__init__.py).
LAYERS = [
    ("records", "errors", "deprecated"),
    ("registry", "config"),
    ("distribute", "tracking", "keras_patches", "search"),
    ("data", "components", "plugins"),
    ("training",),
    ("launch", "reporting", "verification"),
    ("cli", "__main__", "", "tasks", "loops", "hydra_plugins"),
]


def _modules() -> dict[str, Path]:
    """Every module of distlab and of its Hydra plug-ins, by dotted name."""
    found = {}
    for root in (SRC, SRC.parent / "hydra_plugins"):
        for path in root.rglob("*.py"):
            if "conf" in path.relative_to(root).parts:
                continue
            parts = path.relative_to(SRC.parent).with_suffix("").parts
            found[".".join(parts).removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports: every `import` and `from ... import` statement
    (relative ones resolved), at module level and inside functions alike (a function's import
    runs when it is called: it is as much a dependency); `from a import b` is module `a.b` when
    that is a module, else `a`. An import names its module, not the packages above it (whose
    `__init__` Python runs first): those stay light. Strings given to importlib (registry
    import paths) are data, not imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    key = "hydra_plugins" if parts[0] == "hydra_plugins" else parts[1] if len(parts) > 1 else ""
    return next(i for i, names in enumerate(LAYERS) if key in names)


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles: each strongly connected set of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            members: set[str] = set()
            while module not in members:
                members.add(stack.pop())
            if len(members) > 1:
                circles.append(members)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_the_package_docstring_lists_the_layers_bottom_up():
    doc = ast.get_docstring(ast.parse((SRC / "__init__.py").read_text()))
    listed = doc.split("bottom up", 1)[1]
    where = [listed.index(f"`{name}`") for names in LAYERS for name in names if name]
    assert where == sorted(where), "list the layers in LAYERS' order"
    assert set(_layer(m) for m in _graph()) <= set(range(len(LAYERS)))  # each has a layer


def test_no_module_imports_from_a_higher_layer():
    upward = [f"{a} -> {b}" for a, targets in sorted(_graph().items()) for b in sorted(targets)
              if _layer(b) > _layer(a)]
    assert upward == [], "imports from a lower layer to a higher one (move the code down)"


def test_no_import_circle():
    circles = [sorted(c) for c in _circles(_graph())]
    assert circles == []


def test_the_layout_checks_find_what_they_forbid(tmp_path):
    """The checks above on a made-up graph: a circle, and an upward import, inside a function
    and relative, are found."""
    package = tmp_path / "distlab"
    (package / "records").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "records" / "__init__.py").write_text("")
    (package / "records" / "a.py").write_text("def f():\n    from ..training import b\n")
    (package / "records" / "c.py").write_text("from . import a\n")
    (package / "training.py").write_text("import distlab.records.c\n")
    modules = {n: p for n, p in _modules_under(tmp_path).items()}
    graph = {n: _imports(n, p, modules) for n, p in modules.items()}
    assert graph["distlab.records.a"] == {"distlab.training"}
    assert graph["distlab.records.c"] == {"distlab.records.a"}
    assert _layer("distlab.training") > _layer("distlab.records.a")
    assert _circles(graph) == [{"distlab.records.a", "distlab.records.c", "distlab.training"}]


def _modules_under(root: Path) -> dict[str, Path]:
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
            for p in root.rglob("*.py")}


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=180, env={"PYTHONPATH": str(ROOT / "src"),
                                                      "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_every_folder_says_what_it_owns():
    found = sorted(str(p.parent.relative_to(SRC)) for p in SRC.rglob("__init__.py")
                   if p.parent != SRC and "conf" not in p.parts)
    assert found == FOLDERS
    for folder in FOLDERS:
        doc = ast.get_docstring(ast.parse((SRC / folder / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 25, f"{folder}/__init__.py: say what it owns"


def test_the_training_folder_opens_with_who_owns_what():
    doc = ast.get_docstring(ast.parse((SRC / "training" / "__init__.py").read_text()))
    for module in ("experiment", "checkpoints", "controller", "actions", "loops", "export",
                   "runner"):
        assert f"`{module}" in doc, module


TF_FREE = ["distlab", "distlab.config", "distlab.launch.job", "distlab.launch.objective",
           "distlab.launch.api", "distlab.launch.rerun",
           "distlab.records", "distlab.records.fields", "distlab.records.ranking",
           "distlab.records.results", "distlab.records.run_dir", "distlab.records.metrics",
           "distlab.reporting.summary", "distlab.registry",
           "distlab.plugins", "distlab.distribute.cluster", "distlab.tracking.session",
           "distlab.tracking.mlflow_tracker"]


@pytest.mark.slow  # a process that imports TensorFlow and every module
def test_tf_free_layers_import_no_tensorflow_and_no_module_changes_a_process_setting():
    """One fresh interpreter: config, launch and reporting import no TensorFlow (nor Keras);
    then importing every module changes no process setting (cli.py is the one module that
    may: it quiets TensorFlow's C++ start-up lines). The TensorFlow-free modules are checked
    on the settings that need no TensorFlow before TensorFlow is imported; every module on
    all of them after."""
    modules = sorted(
        ".".join(("distlab", *p.relative_to(SRC).with_suffix("").parts))
        .removesuffix(".__init__") for p in SRC.rglob("*.py")
        if "conf" not in p.parts and p.name != "cli.py" and p.name != "watchdog.py")
    code = f"""
import json, logging, os, sys, warnings, importlib
def plain():
    return dict(env=dict(os.environ), levels={{n: logging.getLogger(n).level for n in
                ('', 'absl', 'tensorflow', 'distlab', 'hydra')}},
                filters=len(warnings.filters), handlers=len(logging.getLogger().handlers),
                tf_filters=len(logging.getLogger('tensorflow').filters))
def settings():
    import tensorflow as tf, keras
    from tensorflow.python.framework import config as tf_config
    return dict(plain(), determinism=tf_config.is_op_determinism_enabled(),
                policy=keras.mixed_precision.dtype_policy().name)
start = plain()
for name in {TF_FREE!r}:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras'))
changed = [k for k, v in plain().items() if start[k] != v]
before = settings()
for name in {modules!r}:
    importlib.import_module(name)
after = settings()
print(json.dumps([loaded, changed + [k for k in before if before[k] != after[k]]]))
"""
    loaded, changed = json.loads(_python(code))
    assert loaded == []
    assert changed == []


# the layers above the data (and the plug-in loader, which imports data.prepared)
ABOVE_DATA = ("distlab.training", "distlab.launch", "distlab.reporting", "distlab.cli",
              "distlab.components", "distlab.distribute", "distlab.tracking",
              "distlab.keras_patches", "distlab.plugins", "distlab.api")


def _distlab_imports(path) -> set[str]:
    """The distlab modules a file imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("distlab")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distlab"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names
                      if (SRC.parent / f"{node.module}.{a.name}".replace(".", "/")
                          ).with_suffix(".py").is_file()}
    return found


def test_the_data_modules_hold_one_thing_each_import_no_layer_above_and_no_circle():
    """Each module of data/ under ~400 lines; none imports training, launch, reporting or
    another layer above the data; and the data modules' imports of each other form no
    circle (finite <-> pipeline was one)."""
    modules = {f"distlab.data.{p.stem}": p for p in (SRC / "data").glob("*.py")}
    graph = {name: {m for m in _distlab_imports(path) if m in modules and m != name}
             for name, path in modules.items()}
    for name, path in modules.items():
        assert len(path.read_text().splitlines()) <= 400, f"{name}: split it"
        upward = sorted(m for m in _distlab_imports(path) if m.startswith(ABOVE_DATA))
        assert not upward, f"{name} imports {upward}"

    def circle(name: str, trail: tuple[str, ...]) -> tuple[str, ...] | None:
        if name in trail:
            return (*trail[trail.index(name):], name)
        return next((c for m in sorted(graph[name]) if (c := circle(m, (*trail, name)))),
                    None)

    circles = [c for name in sorted(graph) if (c := circle(name, ()))]
    assert not circles, " -> ".join(circles[0])
