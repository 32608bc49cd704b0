"""One job, from a composed config to its results (no TensorFlow until the run is ours).

`job` validates the config, takes the run directory, decides whether to train, resume or
refuse (the rerun rules), runs the training and returns `Results` (it never exits);
`run_dir` is the directory's layout and its files (history.csv, results.json, the lock,
earlier attempts); `results` defines results.json's fields, the objective a sweeper gets and
which way each figure ranks. A sweep's job processes stop with a checkpoint when the
sweep's process dies (`sweep_parent`) or is stopped (`sweep_signals`: Ctrl-C, SIGTERM).
"""
