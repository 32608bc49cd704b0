"""The documentation site (mkdocs.yml, docs/): its generated reference tables hold every
config key and option and every results.json field; README.md's links resolve and keep the
set-up commands CI runs. `mkdocs build --strict` itself runs in .ci/run (it checks the
pages' links and anchors). No training."""

from __future__ import annotations

import importlib.util
import re

import pytest
from conftest import ROOT, compose


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(hooks, name: str) -> str:
    """A page's markdown as the site shows it (the hook's tables in place)."""
    text = (ROOT / "docs" / name).read_text()
    assert "<!-- generated: " in text, name
    return hooks.on_page_markdown(text)


def _rows(text: str) -> dict[str, list[str]]:
    """{first cell without backticks: the row's cells} of every table row."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and cells[0].startswith("`"):
            out.setdefault(cells[0].strip("`"), cells)
    return out


def _leaves(node, prefix: str = "") -> dict:
    from omegaconf import DictConfig

    out = {}
    for key in node:
        value = node._get_node(key)
        if isinstance(value, DictConfig) and len(value) and key != "callbacks":
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value._value()
    return out


def test_the_configuration_reference_has_every_composed_key_with_its_meaning(hooks):
    """Every key `python run.py --cfg job` prints, with a type, an allowed-values cell where
    the schema has a rule and a meaning; the shared keys' defaults are the composed values."""
    from omegaconf import OmegaConf

    rows = _rows(_page(hooks, "reference/configuration.md"))
    cfg = compose([])
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    groups = {"strategy", "dataset", "model", "task", "optimizer", "schedule", "loop", "logger"}
    for key, value in _leaves(cfg).items():
        assert key in rows, f"{key} is not in the configuration reference"
        _, type_, default, _allowed, meaning = rows[key]
        assert type_ and meaning, f"{key}: no type or meaning"
        if key.split(".")[0] not in groups:  # conf/config.yaml sets none of these
            shown = default.strip("`")
            assert shown == (value if isinstance(value, str) else hooks._value(value)) or (
                value is None and shown == "null"), (key, default, value)
    assert rows["trainer.epochs"][3] == "> 0" and "one of" in rows["precision"][3]


def test_every_option_of_every_group_is_listed(hooks):
    rows = _rows(_page(hooks, "reference/configuration.md"))
    for path in (ROOT / "conf").glob("*/*.yaml"):
        option = f"{path.parent.name}={path.stem}"
        assert option in rows and rows[option][1], f"{option}: not listed, or no description"
    assert "steps_per_execution=50" in rows["loop=keras_fit_fast"][2]


def test_the_results_page_lists_every_field_and_no_other(hooks):
    from distlab.records import fields as results

    text = _page(hooks, "reference/results.md")
    table = [r for r in text.splitlines() if r.startswith("| `")]
    assert [r.split("`")[1] for r in table] == [f.name for f in results.FIELDS]
    for row, field in zip(table, results.FIELDS, strict=True):
        assert row.split("|")[2].strip() == results.WRITTEN_BY[field.when], field.name
        assert ("may be the `objective`" in row) == field.objective, field.name


def _anchors(page) -> set[str]:
    """The ids the site gives a page's headings (Python-Markdown's toc slugs)."""
    from markdown.extensions.toc import slugify
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(page.read_text())
    return {slugify(tokens[i + 1].content, "-") for i, t in enumerate(tokens)
            if t.type == "heading_open"}


def test_the_readmes_links_resolve():
    """README.md and the examples' READMEs link to files that exist, and to headings the
    pages have (mkdocs --strict checks the site's own pages)."""
    from readme_snippets import DOCS

    for doc in (d for d in DOCS if d.name == "README.md"):
        for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)]*))?\)", doc.read_text()):
            if "://" in target:
                continue
            where = f"{doc.relative_to(ROOT)}: {target}"
            assert (doc.parent / target).exists(), where
            assert not anchor or anchor in _anchors(doc.parent / target), f"{where}#{anchor}"


def test_the_readme_shows_the_setup_commands_ci_runs():
    """.ci/run runs the lines marked `# README: <what>` as README.md's set-up shows them (pip
    made quiet, `-q`; the test command as its fast tier, then its slow tier), and the site's
    getting-started page shows the same; then the exhaustive tier."""
    from readme_snippets import blocks

    marked = re.findall(r"^(.+?)\s+# README: \w+", (ROOT / ".ci" / "run").read_text(), re.M)
    tiers = [line for line in marked if line.endswith((' -m "not slow"', " -m slow"))]
    assert len(tiers) == 2 and tiers[0] != tiers[1], marked  # the test command, tier by tier
    shown = list(dict.fromkeys(
        line.replace("pip install -q ", "pip install ").removesuffix(' -m "not slow"')
        .removesuffix(" -m slow") for line in marked))
    assert len(shown) == 2
    for doc in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        assert any(b.text.splitlines() == shown for b in blocks(doc)), doc
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs" in ci
    # and the exhaustive tier (tests/tiers.py) after the suite
    runs = re.findall(r"^python -m pytest .*$", ci, re.M)
    assert runs[-1] == "python -m pytest -q -n 2 -m exhaustive", runs
