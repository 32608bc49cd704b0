"""The data: where examples come from and how they reach the replicas.

`pipeline` loads a split (tfds, or a user's builder returning `splits.DataSplits`), applies
the inference-time preprocessing and the train-only augmentation, and makes the per-epoch
training stream (shuffled per epoch, resumable mid-epoch) plus the row weights that let a
short last batch be split over any replica count. `cache` keeps decoded, preprocessed tfds
splits on disk between runs (a per-entry lock, a manifest checked on every read).
"""
