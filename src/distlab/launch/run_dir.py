"""Moved to `distlab.records.run_dir` (the records layer, which every layer may import).
Kept, without a warning (an internal path), so branches written against the old path keep
running until merged; the layout test refuses it from any layer below launch.
TODO(lead): remove once every branch imports distlab.records.run_dir."""

from distlab.records.run_dir import *  # noqa: F403
from distlab.records.run_dir import RunDirBusy, _fmt, _write_json_atomic  # noqa: F401
