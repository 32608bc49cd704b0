"""Repeats: the jobs (or trials) of a sweep that differ only in `seed` form a group, reported
by its mean, standard deviation, 95% confidence interval and n per figure (`group_repeats`),
ranked by the objective's mean (`rank`). Plain functions of plain rows, so a sweeper can
call them too (a search's trial value over repeats: `interval(values).mean`). No NumPy, no
SciPy: Student's t quantile comes from a table (`t_quantile`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from distlab.records.results import finite

SEED = "seed"  # the override whose values make repeats
LEVEL = 0.95
# Student's t, 97.5% quantile (two-sided 95%), for 1..30 degrees of freedom
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959963984540054  # the normal's 97.5% quantile


def t_quantile(dof: int) -> float:
    """Student's t 97.5% quantile with `dof` degrees of freedom (the half-width factor of a
    two-sided 95% interval): the table up to 30, beyond it the Cornish-Fisher expansion
    around the normal (within 1e-4 of the exact value from 31 on)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {dof}")
    if dof <= len(_T975):
        return _T975[dof - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


@dataclass(frozen=True)
class Interval:
    """A figure over n repeats: mean, sample standard deviation (n-1) and the two-sided 95%
    confidence interval of the mean (Student's t, n-1 degrees of freedom); std and the
    interval are None for n=1."""

    mean: float
    n: int
    std: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def half_width(self) -> float | None:
        return None if self.high is None else self.high - self.mean


def interval(values: Iterable[Any]) -> Interval | None:
    """The Interval of the finite numbers in `values` (None when there are none)."""
    xs = [float(v) for v in values if finite(v)]
    if not xs:
        return None
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return Interval(mean, 1)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(n - 1) * std / math.sqrt(n)
    return Interval(mean, n, std, mean - half, mean + half)


@dataclass
class Group:
    """The rows that differ only in `seed`: their shared `config` (override key -> value,
    seed left out), the seeds, the rows, and each figure's Interval over the completed ones."""

    config: dict[str, str]
    seed: str = SEED  # the override that differs within the group
    seeds: list[str] = field(default_factory=list)
    rows: list[Mapping[str, Any]] = field(default_factory=list)
    stats: dict[str, Interval] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Completed repeats (those with figures), a seed run twice counted once."""
        return len(self.counted())

    def counted(self) -> list[Mapping[str, Any]]:
        """The completed rows, one per seed (the first): a seed run again is the same
        experiment, not another draw of it."""
        seen, rows = set(), []
        for row in filter(_completed, self.rows):
            value = overrides_of(row).get(self.seed)
            if value is None or value not in seen:
                rows.append(row)
                seen.add(value)
        return rows

    def label(self, keys: Sequence[str] | None = None) -> str:
        """`key=value ...` for `keys` (default: every key of the config)."""
        shown = self.config if keys is None else {k: self.config.get(k) for k in keys}
        return " ".join(f"{k}={v}" for k, v in shown.items() if v is not None)


def overrides_of(row: Mapping[str, Any]) -> dict[str, str]:
    """A row's `overrides` (a list of `key=value`, or them joined by spaces) as a dict."""
    raw = row.get("overrides") or []
    items = raw.split() if isinstance(raw, str) else list(raw)
    values = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if sep:
            values[key.lstrip("+~")] = value
    return values


def group_repeats(rows: Sequence[Mapping[str, Any]], fields: Sequence[str],
                  seed: str = SEED) -> list[Group]:
    """The rows grouped by their overrides other than `seed`, in first-seen order, with an
    Interval for each of `fields` over the group's completed rows (`status` "completed", or
    no status). A row: {"overrides": [...] or "k=v k=v", "status": ..., <field>: value}."""
    groups: dict[tuple, Group] = {}
    for row in rows:
        values = overrides_of(row)
        seed_value = values.pop(seed, None)
        group = groups.setdefault(tuple(sorted(values.items())), Group(config=values, seed=seed))
        group.rows.append(row)
        if seed_value is not None:
            group.seeds.append(seed_value)
    for group in groups.values():
        done = group.counted()
        for name in fields:
            stat = interval(r.get(name) for r in done)
            if stat is not None:
                group.stats[name] = stat
    return list(groups.values())


def has_repeats(groups: Sequence[Group]) -> bool:
    """Whether some group holds more than one seed."""
    return any(len(g.rows) > 1 and len(set(g.seeds)) > 1 for g in groups)


def rank(groups: Sequence[Group], objective: str, maximize: bool) -> list[Group]:
    """The groups best first by the mean of `objective`; those without it last."""
    scored = [g for g in groups if objective in g.stats]
    scored.sort(key=lambda g: g.stats[objective].mean, reverse=maximize)
    return scored + [g for g in groups if objective not in g.stats]


def _completed(row: Mapping[str, Any]) -> bool:
    return row.get("status", "completed") == "completed"
