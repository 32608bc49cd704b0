"""distlab's Hydra configs, installed as the package `distlab.conf` (`pkg://distlab.conf`)."""
