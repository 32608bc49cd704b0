"""What a multirun reports when it ends: `summary` (Hydra's `SweepSummary` callback) reads
every job's results.json (`jobs`) and writes the sweep's table (`table`: summary.csv and
summary.md), plot (`plot`: a list of panels) and TensorBoard HParams (`hparams`), ranking the
jobs by the objective's direction from `distlab.records.ranking`. No TensorFlow.
"""
