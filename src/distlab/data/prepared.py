"""What a prepared tfds dataset offers, read from its `dataset_info.json` (no TensorFlow), so
that a split that does not exist, or a dict of features for a model that takes one tensor,
is refused in one line before TensorFlow starts. A dataset not prepared yet is left to
tfds (it is checked when it loads)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from distlab.config.schema import held_out_fraction
from distlab.errors import ConfigError

_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


def info_file(name: str, data_dir: str | None) -> Path | None:
    """`<data dir>/<name>[/<config>]/<version>/dataset_info.json` of a prepared tfds dataset:
    the named version, else the newest prepared one; None when there is none."""
    root = Path(data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets")
    base, _, version = name.partition(":")
    folder = root.expanduser() / base
    if not folder.is_dir():
        return None
    if version:
        found = folder / version / "dataset_info.json"
        return found if found.is_file() else None
    versions = [p for p in folder.iterdir() if _VERSION.match(p.name)
                and (p / "dataset_info.json").is_file()]
    if not versions:
        return None
    return max(versions, key=lambda p: tuple(int(n) for n in p.name.split("."))) \
        / "dataset_info.json"


def split_names(spec: str) -> list[str]:
    """The split names a tfds split spec reads: `train[:90%]+validation` -> train, validation."""
    return [part.split("[", 1)[0].strip() for part in spec.split("+") if part.strip()]


def _read(path: Path) -> tuple[list[str], list[str]]:
    """(split names, top-level feature names) of a prepared dataset; empty when unreadable."""
    try:
        splits = [str(s["name"]) for s in json.loads(path.read_text()).get("splits", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        splits = []
    try:
        spec = json.loads((path.parent / "features.json").read_text())
        features = list(spec["featuresDict"]["features"])
    except (OSError, ValueError, KeyError, TypeError):
        features = []
    return splits, features


def check_tfds(cfg: DictConfig, builtin_model: bool) -> None:
    """Refuse, in one line naming the key: a train, test or validation split, or an input or
    label feature, the prepared dataset does not have; a list of input features (a dict of
    inputs) for distlab's own models, which take one tensor (`builtin_model`)."""
    dataset = cfg.dataset
    features = OmegaConf.select(dataset, "features.input", default=None)
    label = OmegaConf.select(dataset, "features.label", default=None)
    path = info_file(str(dataset.name), dataset.get("data_dir"))
    splits, available = _read(path) if path is not None else ([], [])
    inputs = list(features) if OmegaConf.is_list(features) else [features]
    for role, key in [*(("input", k) for k in inputs), ("label", label)]:
        if available and key is not None and key not in available:
            raise ConfigError(f"dataset.features.{role}={key!r} is not a feature of "
                              f"{dataset.name}; its features: {', '.join(sorted(available))}")
    validation = dataset.get("validation")
    keys = [("train_split", dataset.get("train_split")), ("test_split", dataset.get("test_split"))]
    if validation is not None and str(validation).strip() != "auto" \
            and held_out_fraction(validation) is None:
        keys.append(("validation", validation))
    for key, spec in keys if splits else []:
        for name in split_names(str(spec or "")):
            if name not in splits:
                raise ConfigError(
                    f"dataset.{key}={str(spec)!r} names split {name!r}, which "
                    f"{dataset.name} does not have (its splits: {', '.join(splits)}; "
                    f"{path.parent})")
    if builtin_model and OmegaConf.is_list(features):
        raise ConfigError(
            f"model.name={cfg.model.name} takes one numeric input tensor, and "
            f"dataset.features.input={inputs} gives a dict of inputs: register a model "
            "builder of your own that declares input_spec (see the guide 'Inputs and "
            "preprocessing', docs/guides/inputs.md), or name one feature")
