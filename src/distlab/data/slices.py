"""tfds split specs (`train`, `train[:50%]`, `test[10:]`, `train[:800]`, `train[:90%]+test`)
read by tfds' own parser, on a dataset builder's splits as on a tfds dataset's, and the rule
that the train, validation and test splits they select share no example."""

from __future__ import annotations

import functools
import itertools

import tensorflow as tf
import tensorflow_datasets as tfds

from distlab.errors import DistlabError, first_line, override

Rows = list[tuple[str, int, int]]  # (split name, first row, end row) of each part of a spec


def split_infos(counts: dict[str, int]) -> tfds.core.SplitDict:
    """tfds' description of splits of `counts[name]` rows each (what its parser reads)."""
    return tfds.core.SplitDict([tfds.core.SplitInfo(name=name, shard_lengths=[n], num_bytes=0)
                                for name, n in counts.items()])


def rows(spec: str, infos: tfds.core.SplitDict) -> Rows:
    """The rows `spec` reads, as tfds reads them (its rounding of percentages included);
    ValueError (tfds' message) for a spec it cannot read or a split `infos` lacks."""
    try:
        parts = tfds.core.ReadInstruction.from_spec(spec).to_absolute(infos)
    except (KeyError, AssertionError) as e:
        raise ValueError(first_line(e)) from None
    out = []
    for part in parts:
        n = infos[part.splitname].num_examples
        out.append((part.splitname, part.from_ or 0, n if part.to is None else part.to))
    return out


def select(spec: str, key: str, splits: dict[str, tf.data.Dataset], counts: dict[str, int],
           owner: str) -> tuple[tf.data.Dataset, int]:
    """(the rows of `splits` that `spec`, the value of `dataset.<key>`, reads, their number):
    a dataset builder's splits sliced and joined as tfds slices and joins its own. One line
    naming the key for a spec tfds cannot read, a split the builder does not return, or a
    selection without rows."""
    have = ", ".join(f"{name} ({n} rows)" for name, n in counts.items())
    if spec in splits:  # a whole split, as it is
        if counts[spec] == 0:
            raise DistlabError(f"dataset.{key}={spec!r}: the split {spec!r} that {owner} "
                               f"returns has no rows ({have}); return rows for it")
        return splits[spec], counts[spec]
    try:
        parts = rows(spec, split_infos(counts))
    except ValueError as e:
        raise DistlabError(f"dataset.{key}={spec!r} cannot be read from the splits {owner} "
                           f"returns: {have}: {first_line(e)}") from None
    n = sum(end - start for _, start, end in parts)
    if n == 0:
        raise DistlabError(f"dataset.{key}={spec!r} selects no rows of the splits {owner} "
                           f"returns: {have}; give it a slice with rows")
    pieces = [splits[name].skip(start).take(end - start) for name, start, end in parts]
    try:
        return functools.reduce(tf.data.Dataset.concatenate, pieces), n
    except (TypeError, ValueError) as e:
        raise DistlabError(f"dataset.{key}={spec!r} joins splits whose examples differ: "
                           f"{first_line(e)}") from None


def check_disjoint(specs: dict[str, str], infos: tfds.core.SplitDict) -> None:
    """Refuse two splits (`dataset.<key>`: spec) that share examples, in one line."""
    try:
        read = {key: rows(spec, infos) for key, spec in specs.items()}
    except ValueError:
        return  # a spec tfds reads but this cannot: nothing to compare
    for (key, mine), (other, theirs) in itertools.combinations(read.items(), 2):
        if any(a == b and max(f1, f2) < min(t1, t2)
               for a, f1, t1 in mine for b, f2, t2 in theirs):
            raise DistlabError(_overlap(key, specs[key], other, specs[other]))


def _overlap(key: str, spec: str, other: str, other_spec: str) -> str:
    given = {key: spec, other: other_spec}
    if "validation" in given:
        second = other if key == "validation" else key
        example = (f"{override('dataset.train_split', 'train[:90%]')} "
                   f"{override('dataset.validation', 'train[90%:]')}")
        return (f"{override('dataset.validation', given['validation'])} shares examples with "
                f"{override(f'dataset.{second}', given[second])}: give them disjoint slices "
                f"(e.g. {example}), or hold out a fraction of the train split "
                "(dataset.validation=0.1)")
    example = (f"{override('dataset.train_split', 'train[:80%]')} "
               f"{override('dataset.test_split', 'train[80%:]')}")
    return (f"{override('dataset.test_split', given['test_split'])} shares examples with "
            f"{override('dataset.train_split', given['train_split'])}, and the test split is "
            f"never trained on: give them disjoint slices (e.g. {example})")
