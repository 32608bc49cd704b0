"""What a multirun reports when it ends: `summary` reads every job's results.json and writes
the sweep's table, plot and TensorBoard HParams (Hydra's `SweepSummary` callback), ranking
the jobs by the objective's direction from `distlab.records.ranking`. No TensorFlow.
"""
