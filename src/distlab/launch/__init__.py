"""One job, from a composed config to its results (no TensorFlow until the run is ours): the
top layer, with `reporting`.

`api` is `distlab.train` (compose the config, then run); `job` validates the config, takes the
run directory, decides whether to train, resume or refuse (`rerun`: the rerun rules), runs
the training and returns `Results` (it never exits); `objective` gives a sweeper the
objective's direction before any job runs; `worker_dir`, `refusals` and `sweep_parent` keep
a multi-worker run's and a sweep's bookkeeping. The run directory and results.json's fields
are the records layer's (`distlab.records`); `results` and `run_dir` here are aliases kept
for the old import paths.
"""
