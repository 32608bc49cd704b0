"""The small hooks the Controller runs at step and epoch boundaries, one duty each.

`nan_guard` stops at a non-finite loss; `history` writes history.csv's row, the one-line
epoch summary and the TensorBoard scalars; `profiler` traces `trainer.profile_steps`;
`monitors` holds the target, early stopping and best-checkpoint rules (their state is saved
in every checkpoint); `throughput` times the steps and gives the steady-state rate.
"""
