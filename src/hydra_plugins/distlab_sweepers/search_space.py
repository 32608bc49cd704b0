"""The search space of distlab's Optuna sweeper: `hydra.sweeper.params` and the command line,
in Hydra's override grammar, as Optuna distributions and fixed values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def search_space(params: Any, arguments: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Optuna distributions for the swept keys of `hydra.sweeper.params` and the command
    line (Hydra's override grammar), and the fixed values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from distlab.config.checks import swept_objective
    from distlab.errors import ConfigError

    given = [f"{k!s}={v}" for k, v in (params or {}).items()] + list(arguments)
    if problem := swept_objective(given):
        raise ConfigError(problem)
    space: dict[str, Any] = {}
    fixed: dict[str, Any] = {}
    for override in OverridesParser.create().parse_overrides(given):
        key = override.get_key_element()
        try:
            value = distribution(override)
        except ValueError as e:  # Optuna's check of its bounds: interval(0.1, 0.01)
            raise ConfigError(f"{override.input_line}: Optuna cannot search it ("
                              f"{str(e).splitlines()[0].rstrip('.')}): an interval(low, high) "
                              "needs low <= high (and low > 0 under tag(log, ...)), a "
                              "range(start, stop, step) one value at least") from None
        if isinstance(value, str):
            fixed[key] = value
            space.pop(key, None)
        else:
            space[key] = value
            fixed.pop(key, None)
    return space, fixed


def distribution(override: Any) -> Any:
    """One override as an Optuna distribution (or its value, a string, when not a sweep)."""
    from hydra.core.override_parser.types import Transformer
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if not override.is_sweep_override():
        return override.get_value_element_as_str()
    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(
            transformer=Transformer.encode)))
    if override.is_range_sweep():  # range(start, stop, step): stop excluded, as in Hydra
        step = value.step
        if any(isinstance(v, float) for v in (value.start, value.stop, step)):
            n = int((value.stop - value.start) / step - 1e-9)
            return FloatDistribution(value.start, value.start + n * step, step=step)
        last = value.start + ((int(value.stop) - 1 - int(value.start)) // int(step)) * int(step)
        return IntDistribution(int(value.start), int(last), step=int(step))
    if override.is_interval_sweep():
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(float(value.start), float(value.end), log=log_scale)
    raise NotImplementedError(f"{override.input_line}: not a search space Optuna can sample")


def described(distribution: Any) -> str:
    """An Optuna distribution in Hydra's grammar, as a user writes it: choice(...),
    interval(a, b) or range(a, b, step), tagged log where it is."""
    choices = getattr(distribution, "choices", None)
    if choices is not None:
        return "choice(" + ",".join(map(str, choices)) + ")"
    step = getattr(distribution, "step", None)
    span = (f"range({distribution.low}, {distribution.high}, {step})" if step is not None
            else f"interval({distribution.low}, {distribution.high})")
    return f"tag(log, {span})" if getattr(distribution, "log", False) else span


def first_value(distribution: Any) -> Any:
    """A value of `distribution` a trial could be given: its first choice, or its low end."""
    choices = getattr(distribution, "choices", None)
    return choices[0] if choices is not None else distribution.low


def probes(space: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Trial parameters that give each key's every choice (an interval or range: its low
    end) once: each key's first value, then one key's other choices in turn."""
    first = {k: first_value(d) for k, d in space.items()}
    yield first
    for key, distribution in space.items():
        for choice in (getattr(distribution, "choices", None) or ())[1:]:
            yield {**first, key: choice}
