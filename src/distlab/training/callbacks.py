"""`callbacks:`: the user's Keras callbacks, built before training; the Controller drives
them in every loop through one `keras.callbacks.CallbackList` (see `training.controller`).

Each entry of the `callbacks` dict (its key is a name of the user's choice) is either
`{_target_: package.Class, <arguments>}`, built with `hydra.utils.instantiate`, or
`{name: <a registered callback or package.module:callable>, <keys>}` (the builder is called
with the entry's node, as every registry's builders are), or just that name as a string.
A callback runs on every worker unless it is chief-only: its class says so with
`distlab_chief_only = True`, or its entry with `_chief_only_: true` (which wins).
"""

from __future__ import annotations

import logging
from typing import Any

import keras
from omegaconf import DictConfig, OmegaConf

from distlab.config.checks import check_callback_entry
from distlab.errors import ConfigError, DistlabError, described
from distlab.registry import CALLBACKS

CHIEF_ONLY = "_chief_only_"  # an entry's key: run it on the chief only (true) or everywhere
BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def build(cfg: DictConfig, is_chief: bool = True) -> list[keras.callbacks.Callback]:
    """The configured callbacks this process runs (a chief-only one only on the chief), in
    the config's order; a bad entry is one ConfigError naming `callbacks.<name>`."""
    built = []
    for name, node in (cfg.get("callbacks") or {}).items():
        callback = _build(f"callbacks.{name}", node, is_chief)
        if callback is not None:
            built.append(callback)
    return built


def chief_only(callback: Any, node: Any = None) -> bool:
    """Whether `callback` (an instance or a class) runs on the chief only: its entry's
    `_chief_only_` if set, else its `distlab_chief_only` attribute (default: every worker)."""
    declared = node.get(CHIEF_ONLY) if isinstance(node, DictConfig) else None
    return bool(getattr(callback, "distlab_chief_only", False) if declared is None
                else declared)


def has_batch_hooks(callbacks: list[keras.callbacks.Callback]) -> bool:
    """Whether any of `callbacks` overrides a training batch hook (then its logs are read)."""
    base = keras.callbacks.Callback
    return any(getattr(type(c), hook) is not getattr(base, hook)
               for c in callbacks for hook in BATCH_HOOKS)


def _build(key: str, node: Any, is_chief: bool) -> keras.callbacks.Callback | None:
    check_callback_entry(key, node)
    if isinstance(node, str):
        node = OmegaConf.create({"name": node})
    args = OmegaConf.masked_copy(node, [k for k in node if k != CHIEF_ONLY])
    if "_target_" in node:
        target = str(node._target_)
        located = _locate(target, f"{key}._target_")
        if not is_chief and chief_only(located, node):
            return None  # not built here: its constructor may have side effects too
        what = f"{key}._target_={target}"
        make = lambda: _instantiate(args)  # noqa: E731
    else:
        try:
            builder = CALLBACKS.get(str(node.name))
        except DistlabError as e:
            raise ConfigError(str(e).replace("callback.name=", f"{key}.name=")) from None
        what = f"{key}.name={node.name}"
        make = lambda: builder(OmegaConf.masked_copy(args, [k for k in args  # noqa: E731
                                                            if k != "name"]))
    try:
        callback = make()
    except DistlabError as e:
        raise ConfigError(f"{what}: {e}") from None
    except Exception as e:  # noqa: BLE001 - user code, reported on one line
        raise ConfigError(f"{what} could not be built: {described(e)}") from None
    if not isinstance(callback, keras.callbacks.Callback):
        raise ConfigError(f"{what} built a {type(callback).__name__}, not a "
                          "keras.callbacks.Callback")
    return None if not is_chief and chief_only(callback, node) else callback


def _instantiate(node: DictConfig) -> Any:
    """hydra.utils.instantiate, the constructor's own error (not Hydra's wrapper) raised."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node)
    except InstantiationException as e:
        raise (e.__cause__ or e) from None


def _locate(target: str, key: str) -> Any:
    """The class or callable `target` names (hydra's own lookup), or one line naming `key`."""
    from hydra.utils import get_object

    hydra_log = logging.getLogger("hydra.utils")  # it logs the failure too, in several lines
    hydra_log.disabled = True
    try:
        return get_object(target)
    except Exception as e:  # noqa: BLE001 - an import error of any kind
        cause = e.__cause__ or e
        raise ConfigError(f"{key}={target} does not import ({described(cause)}): give a "
                          "package.module.Class path, e.g. keras.callbacks.CSVLogger") from None
    finally:
        hydra_log.disabled = False
