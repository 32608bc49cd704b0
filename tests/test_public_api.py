"""The public API: every import path any version of README.md documented still imports (a
moved one as an alias that warns once, naming the new path); `__all__` and the version.

DOCUMENTED was read from `git log -p -- README.md` (every `from distlab... import` line and
every `distlab.<name>` the README has named as code); the current README's are checked to be
in it, so a path documented from now on joins the list (and then stays importable).
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings

import pytest
from conftest import ROOT

import distlab

# (module, name, the alias's warning or None): all README versions up to 0.2.0
DOCUMENTED = [
    ("distlab", "train", None), ("distlab", "run", None), ("distlab", "Results", None),
    ("distlab", "register", None), ("distlab", "DataSplits", None),
    ("distlab", "DatasetConfig", None), ("distlab", "Task", None), ("distlab", "Metric", None),
    ("distlab", "Loop", None), ("distlab", "DistlabError", None),
    ("distlab", "keras_inputs", None), ("distlab", "__version__", None),
    ("distlab", "verify", None), ("distlab", "Report", None),  # 0.2.0 (dev): distlab verify
    ("distlab.config", "DatasetConfig", None),
    ("distlab.errors", "ConfigError", None), ("distlab.errors", "DistlabError", None),
    ("distlab.tracking", "Tracker", None),
    ("distlab.training.loops", "Loop", None),
    ("distlab.records", "FIELDS", None),
    ("distlab.launch.results", "FIELDS", "distlab.records.FIELDS"),  # README of 0.2.0 (dev)
    ("distlab.tasks", "Metric", "from distlab import Metric, Task"),  # README of 0.1
    ("distlab.tasks", "Task", "from distlab import Metric, Task"),
    ("distlab.loops", "Loop", "distlab.Loop"),  # README of 0.1: a distlab.loops.Loop subclass
]
NEW_HOME = {"distlab.tasks": "distlab", "distlab.loops": "distlab",
            "distlab.launch.results": "distlab.records"}


def _fresh(module: str) -> None:
    """Forget an alias module, so importing it runs (and warns) again."""
    sys.modules.pop(module, None)
    parent, _, child = module.rpartition(".")
    if parent in sys.modules:
        sys.modules[parent].__dict__.pop(child, None)


@pytest.mark.parametrize("module,name,moved", DOCUMENTED,
                         ids=[f"{m}.{n}" for m, n, _ in DOCUMENTED])
def test_every_documented_name_imports_from_its_documented_path(module, name, moved):
    if moved is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a current path warns about nothing
            value = getattr(importlib.import_module(module), name)
        assert value is not None
        return
    _fresh(module)
    with pytest.warns(FutureWarning) as caught:
        value = getattr(importlib.import_module(module), name)
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert module in message and moved in message and "removed in 0.3.0" in message, message
    assert caught[0].filename == __file__  # it points at the import, not at importlib
    assert value is getattr(importlib.import_module(NEW_HOME[module]), name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: importing it again, or the name, is silent
        exec(f"from {module} import {name}", {})
        parent, _, child = module.rpartition(".")
        getattr(importlib.import_module(parent), child)


def test_an_old_dotted_path_works_after_import_distlab():
    _fresh("distlab.loops")
    with pytest.warns(FutureWarning, match=r"distlab.loops is deprecated .* distlab.Loop"):
        assert distlab.loops.Loop is distlab.Loop


def test_every_path_the_readme_documents_now_is_in_the_list():
    from readme_snippets import DOCS

    text = "\n".join(doc.read_text() for doc in DOCS)
    listed = {(m, n) for m, n, _ in DOCUMENTED}
    for module, names in re.findall(r"from (distlab[\w.]*) import ([\w, ]+)", text):
        for name in (n.strip() for n in names.split(",")):
            assert (module, name) in listed, f"from {module} import {name}: add to DOCUMENTED"
    for dotted in re.findall(r"`(distlab(?:\.\w+)+)[`(]", text):
        module, _, name = dotted.rpartition(".")
        if name[:1].isupper() or name in ("train", "run", "register", "keras_inputs"):
            assert (module, name) in listed, f"{dotted}: add to DOCUMENTED"


def test_all_names_the_public_api_and_the_version_is_the_packages():
    assert sorted(distlab.__all__) == sorted(n for m, n, _ in DOCUMENTED if m == "distlab")
    for name in distlab.__all__:
        assert getattr(distlab, name) is not None
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(),
                        re.MULTILINE).group(1)
    assert distlab.__version__ == version == "0.2.0"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{version}]" in changelog and "## [0.1.0]" in changelog
