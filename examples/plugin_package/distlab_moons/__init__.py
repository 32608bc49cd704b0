"""An example distlab plug-in package: `distlab experiment=moons` once it is installed.

Nothing is imported here: distlab imports `distlab_moons.parts` (the `distlab.plugins` entry
point) and reads the YAMLs of `distlab_moons.conf` (the `distlab.configs` entry point).
"""
