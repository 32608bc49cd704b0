"""One job, from a composed config to its results (no TensorFlow until the run is ours): the
top layer, with `reporting`.

`api` is `distlab.train` (compose the config, then run); `job` validates the config, takes the
run directory, decides whether to train, resume or refuse (`rerun`: the rerun rules), runs
the training and returns `Results` (it never exits); `objective` gives a sweeper the
objective's direction before any job runs; `worker_dir` and `refusals` keep a multi-worker
run's and a sweep's bookkeeping; a sweep's job processes stop with a checkpoint when the
sweep's process dies (`sweep_parent`) or is stopped (`sweep_signals`: Ctrl-C, SIGTERM).
The run directory and results.json's fields are the records layer's (`distlab.records`);
`results` here is a deprecated alias kept for the old import path.
"""
