"""The data: where examples come from and how they reach the replicas.

`pipeline.load` reads a dataset's splits from the source that claims its `dataset.name`
(`pipeline.SOURCES`, each a `source.DataSource` giving `source.RawSplits`): `tfds_source`
(a tensorflow-datasets dataset) or `builder_source` (a user's builder returning
`splits.DataSplits`). It then does the same for every source: the inference-time
preprocessing (`transforms`), the caches (`cache`: decoded, preprocessed splits on disk
between runs, for a source that gives a `cache_key`), a validation fraction held out of
train (`holdout`), the refusal of NaN and Inf (`finite`), and `stream.Data`: the
per-epoch training stream (shuffled per epoch, augmented, resumable mid-epoch) and
`stream.distribute`, which splits each global batch over the replicas with the row
weights that let a short last batch be split over any replica count. `structure` owns an
input's structure (names, ragged and padded batches), `slices` the split specs,
`fingerprint` which rows each split holds, `prepared` the checks made before TensorFlow
starts.

A new source (CSV files, a pandas frame) is a module, `data/<kind>_source.py`, with a
`DataSource` subclass: `claims(name)` says which `dataset.name` values are its own, and
`splits(cfg)` returns `RawSplits` of (input, label) `tf.data.Dataset`s, unbatched, inputs
shaped by `structure.dense_inputs`; `holdout.validation_choice(cfg.validation, has_own=...)`
says which validation split `dataset.validation` asks for, `holdout.with_held_out` holds a
fraction of train out, and `slices.select` reads split specs such as `train[:80%]`. Give
`cache_key` (what the rows depend on, with the `data_dir` whose files are checked) to be
cached on disk, and override `fingerprints` when the rows' identities are known without
reading them. Then list an instance in `pipeline.SOURCES` before `TfdsSource()`, which
claims any name the others do not. Two things outside data/ are not yet per source: the
checks made before TensorFlow starts tell a tfds name from a builder's by
`registry.is_tfds_name` (a new source's names need a rule there), and the `dataset` schema's
keys are shared (a source with keys of its own reads them from `dataset` as a user
dataset's YAML adds them, `+dataset.path=...`).
"""
