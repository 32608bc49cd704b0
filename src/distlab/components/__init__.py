"""The components a config names: one module per group, each builder registered by import
path in `distlab.registry`.

`strategies` (the tf.distribute strategy and the logical CPU devices), `models` (the model
zoo), `tasks` (a task's loss and metrics: `Task`, `Metric`), `metrics` (the metrics
`task.metrics` names, registered in the `metric` registry), `optimizers` (with the batch-size
scaling rule and the training options wrapped around them) and `schedules` (learning-rate
schedules, per step). Each builder is called with its group's config node; none of them
knows about loops, checkpoints or run directories.
"""
