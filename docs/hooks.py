"""MkDocs hook: the generated reference tables, made at build time from the code.

A page holds a marker line, replaced by a table when the site is built:
- `<!-- generated: configuration -->`: every config key of every group (type, default, allowed
  values, meaning), read from the config schema's dataclasses (the meaning: the comments
  beside each field), and every option of conf/<group>/*.yaml (its header comment and the
  keys it sets), composed by Hydra as a run composes it;
- `<!-- generated: results -->`: results.json's fields, from the records layer's list.
Nothing is written to docs/: there is no generated file to go stale. tests/test_docs_site.py
builds the site and checks the tables.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # this checkout's distlab, as run.py uses it
    sys.path.insert(0, str(ROOT / "src"))

MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.M)


def on_page_markdown(markdown: str, page: Any = None, **_: Any) -> str:
    """Replace each marker line with its table."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


# ----------------------------------------------------------------------- results.json


def results_fields() -> tuple[tuple[Any, ...], dict[str, str], str]:
    """The results.json fields, in order, what each `when` means and where the list is: the
    one place the docs read them from."""
    from distlab.records import fields as records  # the records layer

    return records.FIELDS, records.WRITTEN_BY, records.__name__


DIRECTIONS = {"max": "up", "min": "down", "metric": "its metric's way",
              "best": "as checkpoints/best's metric", None: "\u2014"}


def results_table() -> str:
    fields, written_by, where = results_fields()
    head = ["field", "written by", "type", "ranks", "what it holds"]
    rows = [[f"`{field.name}`", written_by[field.when], _text(field.type),
             DIRECTIONS[field.direction],
             field.doc + (" (may be the `objective`)" if field.objective else "")]
            for field in fields]
    legend = ("*ranks*: which way a field ranks where something chooses by it (the sweep "
              "summary's best job, a sweeper, a monitor's `mode: auto`): up, down, its "
              "metric's way (a loss down, a task metric as its `higher_is_better` says), as "
              "the metric `checkpoints/best` follows, or \u2014 (a setting or a label: it "
              "does not rank).")
    return f"Generated from `{where}.FIELDS`.\n\n{legend}\n\n" + _table(head, rows)


# ----------------------------------------------------------------------- configuration


def configuration_reference() -> str:
    from distlab.config import schema

    parts = ["## Top-level keys and `trainer`", "",
             "The composed config's own keys (`Config`), `trainer.*` included.", "",
             _keys_table(schema.Config, "", skip=set(_group_names(schema)))]
    options = _composed_options()
    for group in _group_names(schema):
        parts += ["", f"## `{group}`", ""]
        parts += [_options_table(group, options.get(group, {}), schema), ""]
        for option, cls in schema.GROUP_SCHEMAS.get(group, {}).items():
            title = f"`{group}.name={option}`" if option else f"`{group}`"
            parts += [f"### Keys of {title}", "", *([_doc_of(cls), ""] if _doc_of(cls) else []),
                      _keys_table(cls, f"{group}.", group=_classes(schema, group)), ""]
    for group in sorted(set(options) - set(_group_names(schema))):  # experiment, searches
        parts += ["", f"## `{group}`", "", _options_table(group, options[group], schema)]
    return "\n".join(parts).rstrip() + "\n"


def _classes(schema: Any, group: str) -> tuple[type, ...]:
    return tuple(schema.GROUP_SCHEMAS.get(group, {}).values())


def _group_names(schema: Any) -> list[str]:
    """The option groups: Config's fields that are composed from conf/<group>/."""
    return [f.name for f in dataclasses.fields(schema.Config) if (ROOT / "conf" / f.name).is_dir()]


def _composed_options() -> dict[str, dict[str, tuple[str, dict]]]:
    """{group: {option: (header comment, the option's node)}} for conf/*/*.yaml (experiment
    presets and searches: their header only)."""
    from omegaconf import OmegaConf

    out: dict[str, dict[str, tuple[str, dict]]] = {}
    for path in sorted((ROOT / "conf").glob("*/*.yaml")):
        group, option = path.parent.name, path.stem
        node = _option_node(path) if group not in ("experiment", "hparams_search") else {}
        value = OmegaConf.to_container(node) if node else {}
        out.setdefault(group, {})[option] = (_header(path), value)
    return out


def _option_node(path: Path) -> Any:
    """An option's YAML over what its `defaults` list names (a `/schema_*@_here_` schema,
    another option of its group), in order, as Hydra composes it (`_self_` last if unlisted;
    Hydra itself takes about half a second per option)."""
    from omegaconf import OmegaConf

    from distlab.config.store import schema_names

    raw = OmegaConf.load(path)
    defaults = list(raw.pop("defaults", []))
    if "_self_" not in defaults:
        defaults.append("_self_")
    node = OmegaConf.create({})
    for entry in defaults:
        if entry == "_self_":
            part = raw
        elif str(entry).startswith("/schema_"):
            part = OmegaConf.structured(schema_names()[entry[1:].split("@")[0]])
        else:
            part = _option_node(path.parent / f"{entry}.yaml")
        node = OmegaConf.merge(node, part)
    return node


def _header(path: Path) -> str:
    """A YAML's opening comment, without `# @package` lines."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line.lstrip("#").strip())
    return re.sub(r"(\w)- (\w)", r"\1-\2", " ".join(lines))  # a word cut at a line end


def _options_table(group: str, options: dict[str, tuple[str, dict]], schema: Any) -> str:
    rows = []
    for option, (header, value) in options.items():
        cls = _schema_of(group, value, schema)
        defaults = _flat(_defaults(cls)) if cls else {}
        sets = [f"`{k}={_value(v)}`" for k, v in _flat(value).items()
                if cls and (k not in defaults or defaults[k] != v)]
        rows.append([f"`{group}={option}`", header, ", ".join(sets)])
    if not any(row[2] for row in rows):  # presets and searches: their header says it
        return _table(["option", "what it is"], [row[:2] for row in rows])
    return _table(["option", "what it is", "sets (beside the schema's defaults)"], rows)


def _schema_of(group: str, value: dict, schema: Any) -> type | None:
    options = schema.GROUP_SCHEMAS.get(group, {})
    return options.get("") or options.get(value.get("name")) if options else None


def _defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            out[f.name] = _defaults(type(made)) if dataclasses.is_dataclass(made) else made
    return out


def _flat(value: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, item in value.items():
        if isinstance(item, dict) and item:
            out.update(_flat(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


NAME = ("the name distlab builds this option from: a registered name or package.module:fn "
        "(set by the option's YAML)")


def _keys_table(cls: type, prefix: str, skip: set[str] = frozenset(),
                group: tuple[type, ...] = ()) -> str:
    rows = []
    for key, f, owner in _fields(cls, prefix, skip):
        rule = f.metadata.get("rule")
        rows.append([f"`{key}`", _type(f.type), _default(f), _allowed(f, rule),
                     meaning(f.name, owner, group)])
    return _table(["key", "type", "default", "allowed values", "meaning"], rows)


def meaning(name: str, owner: type, group: tuple[type, ...] = ()) -> str:
    """A key's meaning: its comments in the schema, else those of the same key in a parent
    class or in another option of its group (`l2`, `output_activation`)."""
    for cls in (*owner.__mro__, *group):
        if dataclasses.is_dataclass(cls) and (text := _comments(cls).get(name)):
            return text
    return NAME if name == "name" else ""


def _fields(cls: type, prefix: str, skip: set[str]):
    """(dotted key, field, the class that states it) for every leaf key, nested dataclasses
    flattened."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        made = (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if dataclasses.is_dataclass(made):
            yield from _fields(type(made), f"{prefix}{f.name}.", set())
        else:
            owner = next(c for c in cls.__mro__ if f.name in c.__dict__.get("__annotations__", {}))
            yield f"{prefix}{f.name}", f, owner


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    """{field name: its meaning}: the comment lines just above a field and the comment at
    the end of its line, as the schema states them."""
    source = textwrap.dedent(inspect.getsource(cls))
    notes = {tok.start[0]: tok.string.lstrip("#").strip()
             for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line >= 1 and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, notes[line])
            line -= 1
        beside = [notes[n] for n in range(node.lineno, node.end_lineno + 1) if n in notes]
        out[node.target.id] = " ".join([*above, *beside])
    return out


def _doc_of(cls: type) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    return " ".join(doc.split()) if doc and not doc.startswith(cls.__name__ + "(") else ""


def _type(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    text = text.replace("Any", "any").replace(" | None", " or null").replace(" | ", " or ")
    return text


def _default(f: dataclasses.Field) -> str:
    from omegaconf import MISSING

    if f.default is not dataclasses.MISSING:
        return "(required)" if f.default == MISSING else f"`{_value(f.default)}`"
    return f"`{_value(f.default_factory())}`"


def _allowed(f: dataclasses.Field, rule: Any) -> str:
    text = re.sub(r"^must (be )?", "", rule[1]) if rule else ""
    if not text and _type(f.type).startswith("bool"):
        text = "true, false"
    if text and "or null" in _type(f.type) and "null" not in text:
        text += "; or null"
    return text


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _text(value: Any) -> str:
    return getattr(value, "__name__", None) or getattr(value, "value", None) or str(value)


def _table(head: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


GENERATORS = {"configuration": configuration_reference, "results": results_table}
