"""This package's distlab configs (found as pkg://distlab_moons.conf; no code)."""
