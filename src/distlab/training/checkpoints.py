"""What a checkpoint holds, and saving, resuming and restoring it: one list, one home.

`Checkpoints.state` names every object a checkpoint holds: the model, the optimizer, the
epoch and step-in-epoch counters, the interrupted epoch's running sums, the monitors' state,
the layers' random-generator states and whatever the loop adds (`Loop.state()`). The
`tf.train.Checkpoint` is made of it, and a multi-worker resume broadcasts exactly its
variables from the chief (`distribute.multi_worker.restore_from_chief`), so an item added
here is saved, resumed and broadcast alike.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from distlab.components import models
from distlab.distribute import multi_worker
from distlab.errors import DistlabError, first_line
from distlab.records.run_dir import RunDir
from distlab.training.epoch_sums import EpochSums
from distlab.training.experiment import Experiment

log = logging.getLogger("distlab")
# the checkpoint's name for the epoch's running sums; checkpoints older than it lack it
EPOCH_SUMS = "epoch_sums"
# the training steps the checkpoint's model has taken (its number: ckpt-<steps>); older
# checkpoints lack it and were numbered by their place in the schedule (epochs x
# steps_per_epoch + steps), which is what it is set to when one of them is resumed
TRAINED_STEPS = "trained_steps"


class Checkpoints:
    """The run's checkpoints: `checkpoints/ckpt-<N>` and `checkpoints/best/ckpt-<N>`, where N
    is the number of training steps (batches; micro-batches under trainer.grad_accum_steps)
    the model in it has taken, whatever stopped an epoch early."""

    def __init__(self, exp: Experiment, extra: dict[str, Any] | None = None) -> None:
        """`extra`: the loop's own items (`Loop.state()`), saved and restored with the rest."""
        self.exp = exp
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")  # done
        # steps done in epoch `epoch` (non-zero after a preemption)
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="step_in_epoch")
        # the running sums of those steps (`EpochSums.vector`: float64, with the state of the
        # task's stateful metrics), so a run resumed mid-epoch records the whole epoch
        self.epoch_sums = tf.Variable(tf.zeros([exp.sums.size], tf.float64),
                                      trainable=False, name=EPOCH_SUMS)
        # training steps taken (the Controller counts them): the checkpoints' number
        self.trained_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name=TRAINED_STEPS)
        own = {"model": exp.model, "optimizer": exp.optimizer, "epoch": self.epoch,
               "step_in_epoch": self.step_in_epoch, EPOCH_SUMS: self.epoch_sums,
               TRAINED_STEPS: self.trained_steps,
               **exp.monitors.state, **rng_states(exp.model)}
        self.state: dict[str, Any] = {**own, **_loop_items(exp.cfg.loop.name, extra, own)}
        try:
            self.checkpoint = tf.train.Checkpoint(**self.state)
        except (ValueError, TypeError, AttributeError) as e:
            raise DistlabError(
                f"loop.name={exp.cfg.loop.name!r}: its state() cannot be checkpointed "
                f"({first_line(e)}); state() returns {{name: tf.Variable or another trackable "
                "object}}") from None
        # _set_aside: its state file TensorFlow refused, set aside now
        self.manager, self._set_aside = _manager(self.checkpoint, exp.run_dir.checkpoints,
                                                 exp.cfg.trainer.max_checkpoints)
        self.best = (_manager(self.checkpoint, exp.run_dir.best_checkpoints, 1)[0]
                     if exp.monitors.best else None)

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint

    @property
    def best_latest(self) -> str | None:
        return self.best.latest_checkpoint if self.best else None

    @property
    def position(self) -> tuple[int, int]:
        """(epochs done, steps into the next) as the counters hold them."""
        return int(self.epoch.numpy()), int(self.step_in_epoch.numpy())

    def resumed_sums(self) -> EpochSums:
        """The running sums of the steps before a mid-epoch resume (zeros at a boundary)."""
        if self.position[1]:
            return self.exp.sums.from_vector(self.epoch_sums.numpy())
        return self.exp.sums.zeros()

    # ---- saving
    def save(self, epochs_done: int, steps_in_epoch: int,
             sums: EpochSums | None = None) -> str:
        """ckpt-<training steps taken> at this step boundary, mid-epoch with the epoch's
        running `sums` (steps count batches: micro-batches under trainer.grad_accum_steps)."""
        self.epoch.assign(epochs_done)
        self.step_in_epoch.assign(steps_in_epoch)
        if steps_in_epoch and sums is not None:
            self.epoch_sums.assign(sums.vector())
        else:  # an epoch boundary (or a loop that keeps no sums)
            self.epoch_sums.assign(tf.zeros_like(self.epoch_sums))
        return self.manager.save(checkpoint_number=self.steps_taken)

    @property
    def steps_taken(self) -> int:
        """Training steps the model has taken: the number of the checkpoint saved now."""
        return int(self.trained_steps.numpy())

    def save_again(self) -> str:
        """A checkpoint at the counters' position (after a change made after the last one)."""
        epochs_done, steps = self.position
        return self.save(epochs_done, steps, self.resumed_sums() if steps else None)

    def save_best(self, epoch: int) -> None:
        """checkpoints/best/ckpt-<training steps taken>, after `epoch` (1-based) ended."""
        self.epoch.assign(epoch)
        self.step_in_epoch.assign(0)
        self.best.save(checkpoint_number=self.steps_taken)

    # ---- resuming (training)
    def resume(self) -> tuple[int, int]:
        """Restore the run dir's latest checkpoint, if any: (epochs done, steps into the
        next). Across workers the chief restores and every worker gets its state."""
        exp = self.exp
        latest = self._latest_on_disk() if exp.worker.is_chief else None
        if exp.worker.multi_worker:  # only the chief's disk need hold the run dir
            multi_worker.restore_from_chief(exp.strategy, self.checkpoint, latest,
                                            self._restore_all, self.state)
        elif latest:
            self._restore_all(latest)
        models.refresh_adapted(exp.model)  # adapted layers use the restored statistics
        epoch, step = self.position
        if not latest:  # rows of an attempt killed before its first checkpoint: trained again
            exp.run_dir.truncate_history(0)
            return epoch, step
        exp.run_dir.truncate_history(epoch)
        log.info("resuming from %s: %d epoch(s) done, %d step(s) into the next", latest,
                 epoch, step)
        return epoch, step

    def _latest_on_disk(self) -> str | None:
        """The checkpoint to resume: the one the state file (checkpoints/checkpoint) names;
        when that file is missing or unreadable, or names a checkpoint whose files are
        gone, the newest ckpt-N on disk, with a warning (TensorFlow would start afresh and
        save over them)."""
        listed = self.latest
        if listed and _has_files(listed):
            return listed
        directory = self.exp.run_dir.checkpoints
        numbers = sorted(int(m.group(1)) for p in directory.glob("ckpt-*.index")
                         if (m := re.fullmatch(r"ckpt-(\d+)\.index", p.name)))
        on_disk = [prefix for n in numbers if _has_files(prefix := str(directory / f"ckpt-{n}"))]
        if not on_disk:
            return listed  # (a listed prefix without files: restoring it says so)
        state = directory / "checkpoint"
        why = (f"names {listed}, whose files are gone" if listed else
               "is unreadable" if state.exists() or self._set_aside else "is missing")
        log.warning("%s (TensorFlow's list of checkpoints) %s: resuming from the newest "
                    "checkpoint on disk, %s", state, why, on_disk[-1])
        _list_in(self.manager, on_disk)
        return on_disk[-1]

    def _restore_all(self, prefix: str) -> None:
        # written before checkpoints kept these: the rest of its state
        missing = [k for k in (EPOCH_SUMS, TRAINED_STEPS) if not _holds(prefix, k)]
        if not missing:
            self._restore(self.checkpoint, prefix, what="resume from")
            return
        state = {k: v for k, v in self.state.items() if k not in missing}
        self._restore(tf.train.Checkpoint(**state), prefix, what="resume from")
        epoch, step = self.position
        if TRAINED_STEPS in missing:  # what its number counted
            self.trained_steps.assign(epoch * self.exp.data.steps_per_epoch + step)
        if EPOCH_SUMS in missing and step:
            log.warning("%s predates the epoch sums in checkpoints: the history row of epoch "
                        "%d (which the target, early stopping and best checkpoint read) "
                        "covers only its steps after step %d", prefix, epoch + 1, step)

    # ---- restoring the model only (evaluation)
    def model_state(self) -> dict[str, Any]:
        """What an evaluation restores from a checkpoint: the model weights and the epoch
        counter (never the optimizer, whatever it was trained with)."""
        return {"model": self.exp.model, "epoch": self.epoch}

    def restore_model(self, ckpt_path: str | None) -> str | None:
        """Restore the model of `ckpt_path` (a run dir, its checkpoints/ or a ckpt-N prefix;
        across workers from the chief's disk); return the prefix (None on other workers)."""
        exp = self.exp
        prefix = find_checkpoint(ckpt_path) if exp.worker.is_chief else None
        if exp.worker.multi_worker:  # the chief's disk holds the checkpoint: restore, broadcast
            multi_worker.restore_from_chief(exp.strategy, self.checkpoint, prefix,
                                            self._restore_model, self.model_state())
        else:
            self._restore_model(prefix)
        models.refresh_adapted(exp.model)  # adapted layers use the restored statistics
        return prefix

    def restore_best(self, prefix: str | None) -> None:
        """checkpoints/best's model (`prefix`: the chief's; None on other workers), for its
        test (trainer.best_checkpoint.test); why not, in one line saying what to do (an
        evaluation's advice names ckpt_path)."""
        chief = self.exp.worker.is_chief
        why = "its files are gone" if chief and not (prefix and _has_files(prefix)) else None
        if why is None:
            try:
                self.restore_model(prefix)
                return
            except DistlabError as e:  # its reason, without an evaluation's advice
                why = re.split(r"\. (?:Point|Move|Use) ", str(e).partition(": ")[2])[0]
        raise DistlabError(
            f"trainer.best_checkpoint.test=true cannot test {prefix}: {why}. Put its files "
            "back, or rerun with trainer.best_checkpoint.test=false to complete the run "
            "without that test")

    def _restore_model(self, prefix: str) -> None:
        """The model weights (and epoch counter) of `prefix`, checked against the model.

        They are restored into a twin of the model (same builder, outside any strategy
        scope), then copied. Restored into exp.model itself, the checkpoint's other objects
        under it would stay pending there: a checkpoint also holds
        model.optimizer (compile, or the loop, attaches it), which TensorFlow would restore into the
        optimizer a later compile attaches, this config's (other slots or shapes: an error)."""
        exp = self.exp
        twin = models.build_for(exp.cfg.model, exp.data, exp.model_outputs)
        self._restore(tf.train.Checkpoint(**{**self.model_state(), "model": twin}), prefix,
                      what="restore", partial=True)
        for variable, value in zip(exp.model.variables, twin.variables, strict=True):
            variable.assign(value)

    def _restore(self, checkpoint: tf.train.Checkpoint, prefix: str, what: str,
                 partial: bool = False) -> None:
        cfg = self.exp.cfg
        status = None
        try:
            status = checkpoint.restore(prefix)
            if partial:
                status.expect_partial()
            status.assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, AssertionError, IndexError) as e:
            if status is not None:
                status.expect_partial()  # no list of unrestored values when it is deleted
            else:  # restore() itself raised: no status to tell, its restore still pending
                _expect_partial(prefix)
            if _damaged(e):
                advice = (f"Move its files ({Path(prefix).name}.*) out of the folder: the "
                          "rerun resumes from the newest intact checkpoint"
                          if what == "resume from" else
                          "Point ckpt_path at an intact checkpoint (ckpt-N prefix), or move "
                          "the damaged files away")
                raise DistlabError(
                    f"cannot {what} checkpoint {prefix}: it is truncated or corrupt "
                    f"({first_line(e)}). {advice}; nothing was deleted") from None
            raise DistlabError(
                f"cannot {what} checkpoint {prefix}: it does not match the configured model "
                f"({cfg.model.name}, dataset {cfg.dataset.name}): {_mismatch(e)}. Use the "
                "overrides it was trained with (see its run dir's .hydra/config.yaml)"
            ) from None


def _expect_partial(prefix: str) -> None:
    """Mark the pending restores of `prefix` partial, as `status.expect_partial()` would: a
    `restore` that raised (a shape mismatch) returns no status, and TensorFlow would list each
    unrestored value (dozens of warning lines) under the one-line error once the run's objects
    are deleted. TensorFlow keeps the restore in a private `_CheckpointRestoreCoordinator`
    (TF 2.x, checked on 2.21); without it, nothing is done."""
    import gc

    try:
        from tensorflow.python.checkpoint import checkpoint as tf_checkpoint
    except ImportError:
        return
    coordinator = getattr(tf_checkpoint, "_CheckpointRestoreCoordinator", None)
    if coordinator is None:
        return
    for obj in gc.get_objects():  # (a failed restore only: ~0.1 s)
        if issubclass(type(obj), coordinator) and obj.save_path_string == prefix:
            obj.expect_partial = True


UNREADABLE = "checkpoint.unreadable"  # a state file TensorFlow refused, kept aside


def _manager(checkpoint: tf.train.Checkpoint, directory: Path,
             max_to_keep: int) -> tuple[tf.train.CheckpointManager, bool]:
    """TensorFlow's manager of `directory`, and whether its state file was set aside: one
    TensorFlow refuses (an empty one, left by a crash or a full disk: "Invalid checkpoint
    state") is moved to checkpoint.unreadable (kept), and the resume then takes the newest
    checkpoint on disk."""
    def manager() -> tf.train.CheckpointManager:
        return tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=max_to_keep)

    try:
        return manager(), False
    except ValueError as e:
        state = directory / "checkpoint"
        if "Invalid checkpoint state" not in str(e) or not state.exists():
            raise
        state.replace(state.with_name(UNREADABLE))
        return manager(), True


def _has_files(prefix: str) -> bool:
    """Whether checkpoint `prefix` has its index and data files."""
    return Path(f"{prefix}.index").exists() and any(Path(prefix).parent.glob(
        f"{Path(prefix).name}.data-*"))


def _list_in(manager: tf.train.CheckpointManager, prefixes: list[str]) -> None:
    """Make `manager` hold `prefixes` (oldest first) as if it had saved them, and write its
    state file listing them: its `latest_checkpoint` names the last, and its next saves count
    them all in max_to_keep (so the oldest are deleted as usual). TF has no public way to
    tell a manager; its private `_latest_checkpoint`, `_maybe_delete` and `_record_state`
    (TF 2.x, checked on 2.21: the state file with paths relative to its folder, so a moved
    run dir still resumes) are used where they exist."""
    if all(hasattr(manager, a) for a in ("_latest_checkpoint", "_maybe_delete",
                                         "_record_state")):
        manager._maybe_delete.clear()  # noqa: SLF001 - what a broken state file listed
        for prefix in prefixes:
            manager._maybe_delete[prefix] = Path(f"{prefix}.index").stat().st_mtime  # noqa: SLF001
        manager._latest_checkpoint = prefixes[-1]  # noqa: SLF001
        manager._record_state()  # noqa: SLF001


def _damaged(error: BaseException) -> bool:
    """Whether a restore failed on damaged files (truncated, or bytes that fail their
    checksum) rather than on a mismatch with the model."""
    if isinstance(error, tf.errors.DataLossError | tf.errors.OutOfRangeError | IndexError):
        return True
    text = str(error).lower()
    return any(sign in text for sign in ("checksum does not match", "corrupt", "truncated",
                                         "sstable", "bad magic number"))


def _loop_items(loop: str, extra: Any, own: dict[str, Any]) -> dict[str, Any]:
    """A loop's `state()`, checked: a dict whose names are free in a tf.train.Checkpoint."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise DistlabError(f"loop.name={loop!r}: its state() returned a "
                           f"{type(extra).__name__}; it returns a dict {{name: tf.Variable}}")
    taken = sorted(k for k in extra if k in own or hasattr(tf.train.Checkpoint, k)
                   or not str(k).isidentifier())
    if taken:
        raise DistlabError(f"loop.name={loop!r}: its state() names {', '.join(map(str, taken))}"
                           ", which a checkpoint already uses (or which is not a Python name); "
                           "rename them")
    return dict(extra)


def rng_states(model: keras.Model) -> dict[str, list]:
    """The layers' random-generator states (Dropout, random augmentation layers): Keras'
    SeedGenerator is not tracked by tf.train.Checkpoint, so without them a resumed run would
    draw other dropout masks than an uninterrupted one."""
    states = [v for v in model.non_trainable_variables if v.name == "seed_generator_state"]
    return {"seed_states": states} if states else {}


def find_checkpoint(ckpt_path: str) -> str:
    """A checkpoint prefix from a run dir, its checkpoints/ dir, or a prefix itself."""
    path = Path(ckpt_path).expanduser()
    for directory in (path / "checkpoints", path):
        if directory.is_dir():
            latest = tf.train.latest_checkpoint(str(directory))
            if latest:
                return latest
    if Path(f"{path}.index").exists():
        return str(path)
    raise DistlabError(
        f"ckpt_path={ckpt_path!r} holds no checkpoint: give a run directory with checkpoints/, "
        "a checkpoints/ directory, or a prefix such as <run dir>/checkpoints/ckpt-3"
    )


def run_dir_of(prefix: str) -> RunDir:
    """The run directory a checkpoint prefix lives in (checkpoints/ or checkpoints/best/)."""
    run_dir = Path(prefix).parent.parent  # <run dir>/checkpoints/ckpt-N
    if run_dir.name == "checkpoints":  # <run dir>/checkpoints/best/ckpt-N
        run_dir = run_dir.parent
    return RunDir(run_dir)


def _holds(prefix: str, name: str) -> bool:
    """Whether checkpoint `prefix` saved an object `name` at its root (True when it cannot be
    read: restoring it reports why)."""
    try:
        return any(key.split("/")[0] == name for key, _ in tf.train.list_variables(prefix))
    except (tf.errors.OpError, ValueError):
        return True


def _mismatch(error: BaseException) -> str:
    """TF's mismatch message without the variables' values it lists."""
    text = first_line(error)
    return text.split(": [<", 1)[0].split(". Showing", 1)[0].rstrip(".")
