"""distlab entry point: compose the config with Hydra, run it, return the objective."""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ INFO/WARNING start-up chatter

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))  # run from a plain checkout

from distlab import run  # noqa: E402  (no TensorFlow import here)
from distlab.config import register_configs  # noqa: E402
from distlab.run_dir import check_output_dir_args  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    return run(cfg)


if __name__ == "__main__":
    if problem := check_output_dir_args(sys.argv[1:]):
        sys.exit(f"error: {problem}")
    main()
