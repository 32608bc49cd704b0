"""The wheel: code, every config of conf/ as `distlab.conf`, and the `distlab` command.

It is built offline (no build isolation, no index) from a copy of the checkout, installed
with `pip install --target`, and its `distlab` script composes from a directory outside the
checkout with the installed configs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


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


@pytest.mark.slow
def test_wheel_installs_configs_and_command(tmp_path):
    wheel = _built_wheel(tmp_path)

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

    site = tmp_path / "site"
    out = subprocess.run([*PIP, "install", "--no-deps", "--no-index", "--target", str(site),
                          str(wheel)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    command = site / "bin" / "distlab"
    assert command.is_file(), sorted(p.name for p in site.iterdir())
    # Mark the installed config, so the output shows which conf/ was read.
    installed = site / "distlab/conf/config.yaml"
    installed.write_text(installed.read_text() + "seed: 4242\n")

    user_dir = tmp_path / "user"  # outside the checkout, no conf/ in sight
    user_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    env["PYTHONPATH"] = str(site)  # ahead of the editable install's finder

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
