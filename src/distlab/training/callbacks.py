"""`callbacks:`: the user's Keras callbacks, built before training; the Controller drives
them in every loop through one `keras.callbacks.CallbackList` (see `training.controller`).

Each entry of the `callbacks` dict (its key is a name of the user's choice) is either
`{_target_: package.Class, <arguments>}`, built with `hydra.utils.instantiate`, or
`{name: <a registered callback or package.module:callable>, <keys>}` (the builder is called
with the entry's node, as every registry's builders are), or just that name as a string.
A callback runs on every worker unless it is chief-only: its class says so with
`distlab_chief_only = True`, or its entry with `_chief_only_: true` (which wins).

Refused before training, in one line: Keras callbacks that would fight distlab's own
machinery (`REFUSED`: resume, the learning rate, the progress bar), `EarlyStopping`'s
`restore_best_weights`, and a `monitor` that is not one of the run's figures or is a test
one; a `monitor` with mode auto gets distlab's direction for it (`distlab.records.ranking`).
An exception a callback's hook raises is one line naming `callbacks.<name>` and the hook
(`Callbacks`).
"""

from __future__ import annotations

import logging
from typing import Any

import keras
from omegaconf import DictConfig, OmegaConf

from distlab.config.checks import check_callback_entry
from distlab.config.figures import check_figure, check_validated, needs_validation
from distlab.errors import ConfigError, DistlabError, UserCodeError, described
from distlab.records.ranking import metric_direction
from distlab.records.run_dir import figure_columns
from distlab.registry import CALLBACKS

log = logging.getLogger("distlab")
CHIEF_ONLY = "_chief_only_"  # an entry's key: run it on the chief only (true) or everywhere
BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
_SCHEDULE = ("sets the optimizer's learning rate, and distlab's is the `schedule` group's "
             "LearningRateSchedule, which no callback can set: choose a schedule instead "
             "(schedule=cosine, step_decay, exponential or constant)")
# Keras callbacks that fight distlab's own machinery: why, and what to use instead
REFUSED = {
    keras.callbacks.BackupAndRestore: "cannot resume a distlab run: distlab's own "
    "checkpoints resume it (rerun the same command)",
    keras.callbacks.ReduceLROnPlateau: _SCHEDULE,
    keras.callbacks.LearningRateScheduler: _SCHEDULE,
    keras.callbacks.ProgbarLogger: "is not needed: distlab draws the progress bar itself "
    "(loop.verbose=1, or auto on a terminal)",
}


def build(cfg: DictConfig, is_chief: bool = True) -> dict[str, keras.callbacks.Callback]:
    """The configured callbacks this process runs (a chief-only one only on the chief), in
    the config's order, keyed `callbacks.<name>`; a bad entry is one ConfigError naming it."""
    built = {}
    for name, node in (cfg.get("callbacks") or {}).items():
        callback = _build(f"callbacks.{name}", node, is_chief)
        if callback is not None:
            built[f"callbacks.{name}"] = callback
    return built


def check_monitors(named: dict[str, keras.callbacks.Callback], higher: dict[str, bool],
                   test: bool = False, validation: bool = True,
                   trainer: DictConfig | None = None) -> None:
    """Refuse, in one line, a callback's `monitor` on the test split, not among the run's
    figures, or a `val_` one that no epoch measures (`trainer`'s validate_every), as
    trainer.early_stopping's; give one with mode auto distlab's direction for it, as
    trainer.early_stopping ranks it (`higher`: the task's metrics' higher_is_better; losses
    go down)."""
    figures = figure_columns(list(higher), test=test, validation=validation)
    for key, callback in named.items():
        monitor = getattr(callback, "monitor", None)
        if not isinstance(monitor, str):
            continue
        if not _unused_default(callback):
            if monitor.startswith("val_") and not validation:
                raise needs_validation(f"{key}.monitor", monitor)
            check_figure(f"{key}.monitor", monitor, figures, "per-epoch figure of this run")
            if monitor.startswith("val_") and trainer is not None:
                check_validated(f"{key}.monitor", monitor, trainer)
        if getattr(callback, "mode", None) == "auto":
            callback.mode = metric_direction(monitor, "auto", higher)


def _unused_default(callback: keras.callbacks.Callback) -> bool:
    """A ModelCheckpoint's default monitor (val_loss) while it saves at every epoch: it never
    reads it, so a run without validation (or validating on some epochs) may have it."""
    return (isinstance(callback, keras.callbacks.ModelCheckpoint)
            and not callback.save_best_only and callback.monitor == "val_loss"
            and "{val_" not in str(callback.filepath))


def chief_only(callback: Any, node: Any = None) -> bool:
    """Whether `callback` (an instance or a class) runs on the chief only: its entry's
    `_chief_only_` if set, else its `distlab_chief_only` attribute (default: every worker)."""
    declared = node.get(CHIEF_ONLY) if isinstance(node, DictConfig) else None
    return bool(getattr(callback, "distlab_chief_only", False) if declared is None
                else declared)


def has_batch_hooks(callbacks: list[keras.callbacks.Callback]) -> bool:
    """Whether any of `callbacks` overrides a training batch hook, in its class or on the
    instance (a `LambdaCallback`'s): then its logs are read."""
    base = keras.callbacks.Callback
    return any(hook in vars(c) or getattr(type(c), hook) is not getattr(base, hook)
               for c in callbacks for hook in BATCH_HOOKS)


def warn_resumed(named: dict[str, keras.callbacks.Callback], epoch: int) -> None:
    """At a resume: one warning per callback whose choices depend on the epochs before it
    (its best value, its wait), which it does not have: it starts afresh at `epoch`."""
    for key, callback in named.items():
        remembers = isinstance(callback, keras.callbacks.EarlyStopping) or (
            isinstance(callback, keras.callbacks.ModelCheckpoint)
            and getattr(callback, "save_best_only", False))
        if remembers:
            log.warning("%s (%s) starts afresh at epoch %d of this resumed run: its best value "
                        "and patience are not in the checkpoint, so it may stop or save "
                        "otherwise than an uninterrupted run (trainer.early_stopping and "
                        "trainer.best_checkpoint resume exactly)", key,
                        type(callback).__name__, epoch + 1)


class Callbacks:
    """The user's callbacks, driven as `keras.callbacks.CallbackList`'s hooks (one list per
    callback, so that an exception a callback raises is one DistlabError naming its key and
    hook; distlab's own errors pass unchanged)."""

    def __init__(self, named: dict[str, keras.callbacks.Callback], **params: Any) -> None:
        """`params`: CallbackList's (model, verbose, epochs, steps)."""
        self.named = {key: keras.callbacks.CallbackList([c], **params)
                      for key, c in named.items()}
        self.by_key = dict(named)
        self.callbacks = list(named.values())

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._call("on_train_begin", logs)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._call("on_train_end", logs)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._call("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._call("on_epoch_end", epoch, logs)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._call("on_train_batch_begin", batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._call("on_train_batch_end", batch, logs)

    def _call(self, hook: str, *args: Any) -> None:
        for key, group in self.named.items():
            try:
                getattr(group, hook)(*args)
            except DistlabError:
                raise
            except (Exception, SystemExit) as e:  # noqa: BLE001 - user code, one line (a
                name = type(group.callbacks[0]).__name__  # sys.exit would end a whole sweep)
                raise UserCodeError(f"{key} ({name}.{hook}) raised {described(e)}") from e


def _build(key: str, node: Any, is_chief: bool) -> keras.callbacks.Callback | None:
    check_callback_entry(key, node)
    if isinstance(node, str):
        node = OmegaConf.create({"name": node})
    args = OmegaConf.masked_copy(node, [k for k in node if k != CHIEF_ONLY])
    if "_target_" in node:
        target = str(node._target_)
        located, what = _locate(target, f"{key}._target_"), f"{key}._target_={target}"
        _refuse(key, what, located)  # before its constructor runs
        if not is_chief and chief_only(located, node):
            return None  # not built here: its constructor may have side effects too
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
    except (Exception, SystemExit) as e:  # noqa: BLE001 - user code, reported on one line
        raise UserCodeError(f"{what} could not be built: {described(e)}") from e
    if not isinstance(callback, keras.callbacks.Callback):
        raise ConfigError(f"{what} built a {type(callback).__name__}, not a "
                          "keras.callbacks.Callback")
    _refuse(key, what, type(callback))
    if getattr(callback, "restore_best_weights", False):
        raise ConfigError(
            f"{what} with restore_best_weights=true would report the restored weights' "
            "figures while the checkpoint holds the last epoch's: drop it, and use "
            "trainer.best_checkpoint.metric (checkpoints/best) or trainer.early_stopping")
    return None if not is_chief and chief_only(callback, node) else callback


def _refuse(key: str, what: str, located: Any) -> None:
    """Refuse a Keras callback class (or subclass) of `REFUSED`, in one line naming `key`."""
    for refused, why in REFUSED.items():
        if isinstance(located, type) and issubclass(located, refused):
            shown = (f"keras.callbacks.{refused.__name__}" if located is refused
                     else f"{located.__name__} (a keras.callbacks.{refused.__name__})")
            raise ConfigError(f"{what}: {shown} {why}; remove {key}")


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
