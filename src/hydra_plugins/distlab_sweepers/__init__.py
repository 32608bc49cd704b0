"""distlab's Hydra sweeper plugins (Hydra finds plugins in the hydra_plugins namespace)."""
