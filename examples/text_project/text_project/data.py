"""`reviews`: short film reviews written from templates, labelled by their sentiment.

The data is generated in this file (seeded, so every run sees the same sentences): no
download. A review praises or pans one aspect of a film, sometimes negated ("was not
good"), sometimes with a neutral clause about another aspect; the label is 1 (positive)
when the sentiment word is positive and not negated, or negative and negated. Reviews are
distinct within and across splits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

import distlab
from distlab.config import DatasetConfig

ASPECTS = ["the film", "this movie", "the plot", "the acting", "the cast", "the ending",
           "the soundtrack", "the script", "the director's work", "the dialogue"]
POSITIVE = ["good", "great", "wonderful", "excellent", "moving", "brilliant", "fun", "clever"]
NEGATIVE = ["bad", "boring", "awful", "dull", "terrible", "weak", "messy", "tedious"]
NEUTRAL = ["long", "in colour", "two hours", "based on a novel", "set in paris", "quiet"]
INTENSIFIERS = ["", "", "really ", "very ", "quite ", "truly "]


@dataclass
class ReviewsConfig(DatasetConfig):
    """`dataset=reviews`: distlab's common dataset keys plus the generator's own."""

    train_size: int = 800  # reviews in the train split (validation is held out of them)
    test_size: int = 200  # reviews in the test split
    seed: int = 0  # the generator's seed (train uses seed, test seed + 1)
    negation_rate: float = 0.3  # share of reviews whose sentiment word is negated


def review(rng: np.random.Generator, negation_rate: float) -> tuple[str, int]:
    """One review and its label (1 = positive)."""
    positive, negated = bool(rng.integers(2)), bool(rng.random() < negation_rate)
    aspect = ASPECTS[rng.integers(len(ASPECTS))]
    word = (POSITIVE if positive else NEGATIVE)[rng.integers(len(POSITIVE))]
    clause = (f"{aspect} was {'not ' if negated else ''}"
              f"{INTENSIFIERS[rng.integers(len(INTENSIFIERS))]}{word}")
    if rng.random() < 0.5:  # a neutral clause, before or after
        other = (f"{ASPECTS[rng.integers(len(ASPECTS))]} was "
                 f"{NEUTRAL[rng.integers(len(NEUTRAL))]}")
        clause = f"{other} and {clause}" if rng.random() < 0.5 else f"{clause}, {other}"
    return clause, int(positive != negated)


def reviews(n: int, seed: int, negation_rate: float = 0.3,
            exclude: frozenset[str] = frozenset()) -> tuple[np.ndarray, np.ndarray]:
    """`n` distinct reviews, none of them in `exclude` (a string array), and their labels
    (int64, 1 = positive): a review drawn twice is drawn again, so that no review is both
    in train and in validation or test."""
    rng = np.random.default_rng(seed)
    texts, labels, seen = [], [], set(exclude)
    while len(texts) < n:
        text, label = review(rng, negation_rate)
        if text not in seen:
            seen.add(text)
            texts.append(text)
            labels.append(label)
    return np.array(texts), np.array(labels, np.int64)


@distlab.register("dataset", "reviews", schema=ReviewsConfig)
def reviews_dataset(cfg: DictConfig) -> distlab.DataSplits:
    """Raw strings in (one string per example), two classes."""
    if not 0 <= cfg.negation_rate <= 1:
        raise distlab.DistlabError(
            f"dataset.negation_rate={cfg.negation_rate} is invalid: must be in [0, 1]")
    train = reviews(cfg.train_size, cfg.seed, cfg.negation_rate)
    test = reviews(cfg.test_size, cfg.seed + 1, cfg.negation_rate, frozenset(train[0]))
    return distlab.DataSplits(train=train, test=test, num_classes=2)
