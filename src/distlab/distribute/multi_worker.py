"""What the workers of a MultiWorkerMirroredStrategy run agree on, and how they fail.

- `from_chief`: values as the chief's first replica has them, on every worker (one
  replica-context SUM all-reduce per dtype, the other replicas contributing zeros;
  `strategy.extended.broadcast_to` only copies within one worker).
- `same_config`: every worker checks, before anything is built, that it runs the chief's
  experiment (a digest of the keys that decide training), and learns the chief's run dir.
- `agree`: the chief's verdict on the run dir (train, already completed, refused), so no
  worker trains, or waits, alone.
- `restore_from_chief`: resume from the chief's latest checkpoint even when only the
  chief's disk holds the run dir: the chief restores, then every variable of what a
  checkpoint holds (`Checkpoints.state`: model, optimizer, counters, epoch sums, monitors,
  the loop's own items) is broadcast; an evaluation broadcasts the model and epoch only.
- `preemption_handler`: TensorFlow's PreemptionCheckpointHandler; SIGTERM to any worker
  makes all of them save at the same step (through distlab's own save) and stop.
- `lost_worker`: a peer's death as one line naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from distlab.config import worker_config, worker_diff
from distlab.config.reruns import WORKER_LOCAL_GROUPS, WORKER_LOCAL_KEYS
from distlab.distribute.cluster import Worker
from distlab.errors import DistlabError, LostWorker

SUM = tf.distribute.ReduceOp.SUM
log = logging.getLogger("distlab")

VERDICTS = ("train", "completed", "refused")
# what a collective raises when a peer is gone (refused connection, missed heartbeats,
# timed-out collective, aborted group)
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
               tf.errors.AbortedError, tf.errors.CancelledError, tf.errors.InternalError)


def _not_total_run_calls(record: logging.LogRecord) -> bool:
    return "total_run_calls" not in record.getMessage()


def quiet_collectives() -> None:
    """Drop TensorFlow's deprecation note that PreemptionCheckpointHandler triggers itself
    (it reads its own deprecated property when it saves); idempotent."""
    logger = logging.getLogger("tensorflow")
    if _not_total_run_calls not in logger.filters:
        logger.addFilter(_not_total_run_calls)


def from_chief(strategy: tf.distribute.Strategy, values: Sequence) -> list[tf.Tensor]:
    """`values` (tensors or variables) as replica 0, on the chief, holds them."""
    by_dtype: dict[tf.DType, list[int]] = defaultdict(list)
    for i, v in enumerate(values):
        by_dtype[v.dtype].append(i)

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        mine = tf.equal(ctx.replica_id_in_sync_group, 0)
        out = [None] * len(values)
        for indices in by_dtype.values():
            local = [tf.identity(values[i]) for i in indices]
            reduced = ctx.all_reduce(SUM, [tf.where(mine, t, tf.zeros_like(t)) for t in local])
            for i, t in zip(indices, reduced, strict=True):
                out[i] = t
        return out

    result = tf.function(lambda: strategy.run(replica_fn))()
    return [strategy.experimental_local_results(r)[0] for r in result]


_exchanges = 0  # same_config calls in this process: each uses keys of its own


def same_config(worker: Worker, config: dict[str, Any], run_dir: Path,
                timeout_s: float) -> None:
    """Stop every worker, with the same one line, unless all run the chief's experiment.

    Each worker publishes its `worker_config` (every key but the per-machine ones) with a
    digest, and its run dir, in the coordination service's key-value store, then reads every
    worker's: a digest that differs from the chief's names the keys and both values. Sets
    `worker.chief_run_dir`. No collective: workers with other batch sizes or epochs agree
    on nothing else."""
    from tensorflow.python.eager import context

    global _exchanges
    _exchanges += 1
    store = context.context()
    mine = worker_config(config)
    text = json.dumps(mine, sort_keys=True, default=str)
    store.set_config_key_value(f"distlab/config/{_exchanges}/{worker.rank}", json.dumps(
        {"digest": hashlib.sha256(text.encode()).hexdigest(), "config": mine,
         "run_dir": str(run_dir)}, sort_keys=True, default=str))
    entries = []
    for rank, address in enumerate(worker.workers):
        try:
            entries.append(json.loads(store.get_config_key_value(
                f"distlab/config/{_exchanges}/{rank}", timeout_in_ms=int(timeout_s * 1000))))
        except tf.errors.OpError as e:
            raise DistlabError(
                f"worker {rank} ({address}) did not publish its config within "
                f"strategy.connect_timeout_s={timeout_s:g} s ({type(e).__name__}); rerun "
                "all workers") from None
    chief = entries[0]
    worker.chief_run_dir = chief["run_dir"]
    for rank, entry in enumerate(entries[1:], start=1):
        if entry["digest"] != chief["digest"]:
            # every worker finds the same mismatch; none leaves (the chief's leaving ends the
            # coordination service) before all have read every entry
            try:
                store.wait_at_barrier(f"distlab/config/{_exchanges}/read",
                                      int(timeout_s * 1000))
            except tf.errors.OpError as e:
                log.debug("config barrier: %s", e)
            raise DistlabError(_config_mismatch(worker.workers, rank, chief["config"],
                                                entry["config"]))


def _config_mismatch(workers: list[str], rank: int, chief: dict[str, Any],
                     other: dict[str, Any]) -> str:
    keys = worker_diff(chief, other)
    shown = ", ".join(f"{k} ({chief.get(k, '<absent>')!r} on the chief, "
                      f"{other.get(k, '<absent>')!r} on worker {rank})" for k in keys[:6])
    more = f" and {len(keys) - 6} more" if len(keys) > 6 else ""
    local = ", ".join(sorted(WORKER_LOCAL_KEYS) + [f"{g}.*" for g in WORKER_LOCAL_GROUPS])
    return (f"worker {rank} ({workers[rank]}) was started with another config than the chief "
            f"({workers[0]}): {shown}{more}. Start every worker with the same config and "
            f"overrides (only {local} may differ per machine)")


def agree(strategy: tf.distribute.Strategy, verdict: str | None) -> str:
    """The chief's `verdict` (one of VERDICTS) on every worker; others pass None."""
    code = tf.constant(VERDICTS.index(verdict) if verdict else 0, tf.int64)
    return VERDICTS[int(from_chief(strategy, [code])[0])]


def state_variables(state: dict[str, Any]) -> list:
    """The variables of `state` (a checkpoint's objects by name: models, optimizers,
    variables, lists of them), each once, in a fixed order."""
    found: dict[int, Any] = {}

    def add(value: Any) -> None:
        if isinstance(value, list | tuple):
            for item in value:
                add(item)
        elif isinstance(value, keras.Model | keras.optimizers.Optimizer):
            add(list(value.variables))
        else:
            found.setdefault(id(value), value)

    add(list(state.values()))
    return list(found.values())


def restore_from_chief(strategy: tf.distribute.Strategy, checkpoint: tf.train.Checkpoint,
                       latest: str | None, restore: Callable[[str], None],
                       state: dict[str, Any]) -> None:
    """Give every worker the chief's checkpoint `latest` (None: no checkpoint, or not the
    chief): `restore(prefix)` restores it on the chief, then the variables of `state` (what
    the checkpoint holds, `training.checkpoints.Checkpoints.state`, or an evaluation's model
    and epoch) are broadcast."""
    with strategy.scope():
        checkpoint.save_counter  # noqa: B018 - created now on every worker, not lazily
    if latest:  # only the chief has it
        restore(latest)
    found = from_chief(strategy, [tf.constant(1 if latest else 0, tf.int64)])[0]
    if not int(found):
        return
    variables = state_variables(state)
    for variable, value in zip(variables, from_chief(strategy, variables), strict=True):
        variable.assign(value)


# PreemptionCheckpointHandler's own threads (they watch the coordination service)
WATCHER_THREADS = ("PeerTerminationWatcher", "WorkerTerminationSignalWatcher")


def _quiet_watcher_threads() -> None:
    """When the chief (the coordination service's leader) dies, the handler's watcher thread
    on every other worker dies with a raw UnavailableError traceback; the main thread reports
    the loss in one line (`lost_worker`), so that traceback is dropped. Idempotent."""
    previous = threading.excepthook
    if getattr(previous, "distlab_quiet", False):
        return

    def hook(args: Any) -> None:
        name = getattr(args.thread, "name", "") or ""
        if name.startswith(WATCHER_THREADS) and isinstance(args.exc_value, tf.errors.OpError):
            log.debug("%s ended: %s", name, args.exc_value)
            return
        previous(args)

    hook.distlab_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def preemption_handler(exp, scratch: Path, save: Callable[[], str],
                       stop: Callable[[str], None]):
    """TensorFlow's PreemptionCheckpointHandler for this run. It coordinates the workers
    (which step to save at); `save()` writes distlab's own checkpoint and `stop(path)`
    ends the run. Its own step counter lives in a throw-away checkpoint in `scratch`, so
    every worker starts it at 0 (restoring it on the chief only would desynchronise it).

    The handler's directory is `scratch/counter`, not `scratch` itself: a non-chief worker
    writes to `workertemp_<i>/` beside that directory and deletes all of `workertemp_<i>/`
    when it stops, which beside `scratch` would be the temp folder's, shared by every
    multi-worker run on the machine."""
    _quiet_watcher_threads()
    saved: list[str] = []
    where = "" if exp.worker.is_chief else " (on the chief: its run dir's checkpoints/)"
    config = tf.distribute.experimental.TerminationConfig(
        save_fn=lambda *args, **kwargs: saved.append(save()),
        exit_fn=lambda: stop((saved[-1] if saved else "none") + where))
    return tf.distribute.experimental.PreemptionCheckpointHandler(
        exp.strategy.cluster_resolver, tf.train.Checkpoint(), str(scratch / "counter"), config)


def lost_worker(error: tf.errors.OpError, worker: Worker, latest: str | None) -> LostWorker:
    """One line naming the worker a collective lost, for every surviving worker, and the
    checkpoint a rerun resumes from: `latest` (this worker's), as the chief's run dir holds
    it (another worker's own copy is in a temporary directory deleted on exit)."""
    text = str(error)
    lost = [w for w in worker.workers if w in text]
    for index in re.findall(r"/job:(?:worker|chief)/replica:\d+/task:(\d+)", text):
        if int(index) < len(worker.workers) and int(index) != worker.index:
            lost.append(worker.workers[int(index)])
    others = [w for i, w in enumerate(worker.workers) if i != worker.index]
    who = ", ".join(dict.fromkeys(lost)) or (
        others[0] if len(others) == 1 else "a peer (one of " + ", ".join(others) + ")")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = next((line for line in lines if any(k in line.lower() for k in REASONS)),
                  lines[0] if lines else "")
    if latest and not worker.is_chief:
        name = Path(latest).name
        latest = (f"{Path(worker.chief_run_dir) / 'checkpoints' / name}, in the chief's run dir"
                  if worker.chief_run_dir else f"{name}, in the chief's run dir")
    return LostWorker(
        f"lost worker {who} ({type(error).__name__}: {reason[:160]}); rerun all workers to "
        f"resume from the latest checkpoint ({latest or 'none yet: the run starts over'})")


# words of the line that says why a collective failed
REASONS = ("connection", "unhealthy", "heartbeat", "timed out", "socket closed", "aborted")


