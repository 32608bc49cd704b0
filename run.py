"""distlab from a checkout: `python run.py ARGS` is the `distlab` command with this conf/."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))  # run from a plain checkout

from distlab.cli import main  # noqa: E402  (no TensorFlow import here)

if __name__ == "__main__":
    main(config_path=str(ROOT / "conf"))
