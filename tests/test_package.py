"""The wheel: code, every config of conf/ as `distlab.conf`, and the `distlab` command.

It is built offline (no build isolation, no index) from a copy of the checkout, installed
with `pip install --target`, and its `distlab` script composes from a directory outside the
checkout with the installed configs; so does a plug-in package's preset, from the package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def test_pyproject_lists_every_package_of_the_source_tree():
    """pyproject.toml names the packages one by one (conf/ is mapped to `distlab.conf`): a
    sub-package missing there is missing from the wheel, and `import distlab` fails."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT / "src").parts)
             for p in (ROOT / "src").rglob("__init__.py") if "__pycache__" not in p.parts}
    assert found | {"distlab.conf"} == listed


def _built_wheel(tmp_path: Path) -> Path:
    """Build the wheel from a clean copy, so the checkout gets no build/ or egg-info."""
    pytest.importorskip("setuptools", reason="the offline build needs setuptools (.[dev])")
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for name in ("src", "conf"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    dist = tmp_path / "dist"
    out = subprocess.run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-w", str(dist), str(tree)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = dist.glob("distlab-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """distlab's wheel, built once per module, and the folder it is installed in."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheel = _built_wheel(tmp_path)
    site = tmp_path / "site"
    out = subprocess.run([*PIP, "install", "--no-deps", "--no-index", "--target", str(site),
                          str(wheel)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    return wheel, site


def _env(*paths: Path) -> dict[str, str]:
    """This environment with `paths` ahead of the editable install's finder."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    env["PYTHONPATH"] = os.pathsep.join(map(str, paths))
    return env


# both on one xdist worker (`-n 2` hands tests out with --dist loadgroup): the wheel is built
# and installed once (the `installed` fixture, per module and worker)
@pytest.mark.slow
@pytest.mark.xdist_group("wheel")
def test_wheel_installs_configs_and_command(installed, tmp_path):
    wheel, site = installed

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = zf.read(entry_points).decode()
    configs = {p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    assert "config.yaml" in configs
    assert {f"distlab/conf/{c}" for c in configs} <= names, "configs missing from the wheel"
    code = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src").rglob("*.py")}
    assert code <= names, f"not in the wheel (list new packages in pyproject): {code - names}"
    assert "[console_scripts]" in scripts and "distlab = distlab.cli:main" in scripts, scripts

    command = site / "bin" / "distlab"
    assert command.is_file(), sorted(p.name for p in site.iterdir())
    # Mark the installed config, so the output shows which conf/ was read.
    config = site / "distlab/conf/config.yaml"
    config.write_text(config.read_text() + "seed: 4242\n")

    user_dir = tmp_path / "user"  # outside the checkout, no conf/ in sight
    user_dir.mkdir()
    env = _env(site)

    def distlab(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(command), *args], cwd=user_dir, env=env,
                              capture_output=True, text=True, timeout=90)

    job = distlab("--cfg", "job", "dataset=fashion_mnist", "loop=custom")
    assert job.returncode == 0, job.stdout + job.stderr
    assert "seed: 4242" in job.stdout, job.stdout  # the installed package's config.yaml
    assert "name: fashion_mnist" in job.stdout and "name: custom" in job.stdout, job.stdout

    info = distlab("--info", "searchpath")
    assert info.returncode == 0, info.stdout + info.stderr
    assert "pkg://distlab.conf" in info.stdout and str(ROOT) not in info.stdout, info.stdout

    bad = distlab("loop=nope")  # a group's options are listed from the installed package
    assert bad.returncode != 0 and "keras_fit_fast" in bad.stderr, bad.stdout + bad.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("wheel")  # (the wheel of the test above)
def test_plugin_package_ships_its_configs(installed, tmp_path):
    """examples/plugin_package installed beside distlab: its preset runs from an empty
    directory with no --config-dir (its distlab.configs and distlab.plugins entry points)."""
    _, site = installed
    tree = tmp_path / "plugin_package"  # a copy: the build leaves build/ and egg-info behind
    shutil.copytree(ROOT / "examples/plugin_package", tree,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    plugin_site = tmp_path / "plugin_site"
    out = subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--target", str(plugin_site), str(tree)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    run = subprocess.run([sys.executable, str(site / "bin" / "distlab"), "experiment=moons",
                          "trainer.epochs=1", "dataset.examples=256", "loop.verbose=0",
                          "trainer.export=false"],
                         cwd=user_dir, env=_env(plugin_site, site), capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    (results,) = user_dir.glob("outputs/*/*/results.json")
    fields = json.loads(results.read_text())
    assert fields["status"] == "completed" and fields["epochs_completed"] == 1, fields
    config = yaml.safe_load((results.parent / ".hydra/config.yaml").read_text())
    assert (config["dataset"]["name"], config["model"]["name"]) == ("moons", "moons_mlp")


def test_distlab_s_hydra_plugins_are_found_however_it_is_installed(tmp_path):
    """Outside the checkout (no run.py putting src/ on the path), as the `distlab` command and
    distlab.train run: Hydra discovers distlab's search-path plugin and sweeper, also from
    an editable install (whose import hook Hydra cannot list)."""
    code = ("from distlab.config import register_configs; register_configs()\n"
            "from hydra.core.plugins import Plugins\n"
            "from hydra.plugins.search_path_plugin import SearchPathPlugin\n"
            "from hydra.plugins.sweeper import Sweeper\n"
            "found = Plugins.instance().discover\n"
            "print(sorted(p.__name__ for p in [*found(SearchPathPlugin), *found(Sweeper)]))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    found = out.stdout.strip()
    assert "'DistlabPackageConfigs'" in found and "'DistlabOptunaSweeper'" in found, found
