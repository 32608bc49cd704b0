"""Overrides that distlab suggests (in error messages and the README) work when pasted into
a shell: quoted for Hydra's grammar (`train[:90%]`) and for the shell around it."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import ROOT, compose

from distlab.errors import override


def _parsed(text: str) -> tuple[str, object]:
    """What a POSIX shell hands the program, then what Hydra reads: (key, value)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    words = shlex.split(text)
    assert len(words) == 1, words
    parsed = OverridesParser.create().parse_override(words[0])
    return parsed.get_key_element(), parsed.value()


@pytest.mark.parametrize("value", ["train[:90%]", "train[90%:]", "test[10:]", "my run/dir",
                                   "it's", "a,b", "$HOME/x", "plain", "0.1", None])
def test_an_override_survives_the_shell_and_hydra(value):
    key, read = _parsed(override("dataset.validation", value))
    assert key == "dataset.validation"
    assert read == (value if value != "0.1" else 0.1)
    assert override("dataset.validation", "train[90%:]") == \
        "\"dataset.validation='train[90%:]'\""  # as the README writes it


def test_the_overlap_refusal_suggests_overrides_that_run(tiny_data_dir):
    import tensorflow_datasets as tfds

    from distlab.data.slices import check_disjoint
    from distlab.errors import DistlabError

    splits = tfds.builder("mnist", data_dir=str(tiny_data_dir)).info.splits
    with pytest.raises(DistlabError) as refused:
        check_disjoint({"train_split": "train", "test_split": "test",
                        "validation": "train[80%:]"}, splits)
    example = re.search(r"\(e\.g\. (.*?)\), or hold out", str(refused.value)).group(1)
    cfg = compose(shlex.split(example))  # as bash passes them to `python run.py`
    assert (cfg.dataset.train_split, cfg.dataset.validation) == ("train[:90%]", "train[90%:]")


def test_the_docs_split_overrides_run_as_printed():
    from readme_snippets import docs_text

    spans = re.findall(r"`([^`]*train\[[^`]*)`", docs_text())
    commands = [s for s in spans if re.match(r"^[\"']?dataset\.\w+=", s)]
    assert commands
    for text in commands:
        words = shlex.split(text)
        cfg = compose(words)
        for word in words:  # each key holds the slice as written (quotes removed)
            key, _, value = word.partition("=")
            assert "[" in cfg.dataset[key.removeprefix("dataset.")], text


def test_an_unquoted_split_override_is_named_with_the_quoting_that_reads_it(tmp_path):
    import distlab

    refused = distlab.train(["dataset.validation=train[90%:]"], config_path=ROOT / "conf",
                            output_dir=tmp_path / "run")
    assert refused.exit_code == 2 and "\n" not in refused.error
    assert refused.error.startswith("dataset.validation=train[90%:]: Hydra cannot read this "
                                    "override (mismatched input '[' expecting <EOF>)")
    suggested = refused.error.rpartition(": ")[2]
    assert _parsed(suggested) == ("dataset.validation", "train[90%:]")
