from __future__ import annotations

import pytest

from distlab.registry import Registry, RegistryError


def test_register_and_get():
    reg = Registry("widget")

    @reg.register("a")
    def build_a():
        return "A"

    assert reg.get("a")() == "A" and "a" in reg and reg.names() == ["a"]


def test_duplicate_name_is_an_error():
    reg = Registry("widget")
    reg.register("a")(lambda: 1)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a")(lambda: 2)


def test_unknown_name_lists_known_names():
    reg = Registry("widget")
    reg.register("beta")(lambda: 1)
    reg.register("alpha")(lambda: 2)
    with pytest.raises(RegistryError, match=r"unknown widget\.name 'gamma'.*alpha, beta"):
        reg.get("gamma")
