"""A tiny generic registry: one per config group, name -> builder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from distlab.errors import DistlabError

T = TypeVar("T", bound=Callable)


class RegistryError(DistlabError):
    """Unknown or duplicate registry name."""


class Registry(Generic[T]):
    """Maps the names used in a config group to the callables that build them."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REG.register("adam")`. Registering a name twice is an error."""

        def decorator(fn: T) -> T:
            if name in self._items:
                raise RegistryError(f"{self.group} '{name}' is already registered")
            self._items[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> T:
        """The builder for `name`; an unknown name lists the known ones."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise RegistryError(
                f"unknown {self.group}.name '{name}'; known {self.group} names: {known}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
