"""The package's shape: folders that say what they own, TensorFlow-free layers that stay so,
and no module that changes process settings when it is imported (no training)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from conftest import ROOT

SRC = ROOT / "src" / "distlab"
FOLDERS = ["components", "config", "data", "distribute", "keras_patches", "launch",
           "reporting", "tracking", "training", "training/actions", "training/loops"]


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


TF_FREE = ["distlab", "distlab.config", "distlab.launch.job", "distlab.launch.results",
           "distlab.launch.run_dir", "distlab.reporting.summary", "distlab.registry",
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
