"""Training one experiment. Who owns what:

- `experiment`: the built pieces of a run (data, task, model, optimizer, schedule,
  monitors, the task's stateful metrics), built once from the config, then only read.
- `metrics`: a task's stateful Keras metrics under the strategy (a training and an
  evaluation copy in its scope; their states add up like the epoch's sums).
- `checkpoints`: what a checkpoint holds (one `state` dict: a loop may add items), saving,
  resuming (the chief restores, every worker gets the state by broadcast) and restoring a
  model for evaluation.
- `controller`: the epoch loop. It asks a loop for blocks of steps and runs the actions at
  step and epoch boundaries; it owns the stop on a signal or preemption.
- `actions`: one duty each: NaN guard, history row and TensorBoard scalars, profiler,
  monitors (target, early stopping, best checkpoint), throughput.
- `loops`: how steps run. A loop implements `train_step` (or `train_steps(iterator, n)`,
  which returns an `EpochSums`: `epoch_sums`); `keras_fit` runs Keras' compiled
  `model.train_function` on each block; evaluation is shared.
- `export`: the SavedModel that serves raw inputs, checked after reloading.
- `runner`: the job's training or evaluation, top to bottom, and its results.json.
- `evaluation`: what `mode=evaluate` checks against the checkpoint's training run (its
  preprocessing, split keys or rows, precision) before it scores.
"""
