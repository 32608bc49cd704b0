"""`distlab.train`: compose the config as the `distlab` command does (Hydra's errors as one
line) and run one job in this process (`job.run`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from distlab.config import register_configs
from distlab.config.checks import composition_problem
from distlab.config.store import config_dirs_problem
from distlab.errors import DistlabError, hydra_value
from distlab.launch.job import USER_ERROR, Results, run
from distlab.launch.worker_dir import non_chief, own_dir
from distlab.records.run_dir import RunDir, refused_output_dir


def train(overrides: Sequence[str] = (), config_dir: str | Path | None = None,
          output_dir: str | Path | None = None, *,
          config_path: str | Path | None = None) -> Results:
    """Compose the config as `distlab [--config-dir CONFIG_DIR] OVERRIDES` would and run one
    job in this process.

    `config_dir`: your own config directory, added to the config search path after
    distlab's configs, as the command's `--config-dir` (a relative path is taken from the
    current directory): its YAMLs are more options of distlab's groups. `config_path`: the
    primary config directory, in place of the configs installed with distlab (a checkout's
    `conf/`, as `python run.py` uses). `output_dir`: the run directory (default: the config's
    `hydra.run.dir`, outputs/<date>/<time>). distlab's log lines of the job also go to its
    run.log. Never exits: see `Results.exit_code` and `.error`."""
    register_configs()
    flags = [o for o in overrides if str(o).startswith("-")]
    problem = (f"distlab.train takes overrides, not the command's flags ({flags[0]}): "
               "--config-dir DIR is config_dir=DIR; -m (a sweep) and --cfg have no "
               "distlab.train form (call it once per job)" if flags else
               config_dirs_problem(config_dir, config_path))
    if problem:
        return Results(Path(output_dir or "."), exit_code=USER_ERROR, error=problem)
    if config_dir is not None and config_path is None \
            and (Path(config_dir).expanduser() / "config.yaml").is_file():
        warnings.warn(
            f"distlab.train(config_dir={str(config_dir)!r}): config_dir adds your configs to "
            "distlab's, as `distlab --config-dir` does (since 0.2.0), so its config.yaml is "
            f"not the primary config; to compose from it, pass config_path={str(config_dir)!r}",
            FutureWarning, stacklevel=2)
    try:
        composed = _compose(list(overrides), config_dir, config_path)
    except DistlabError as e:
        return Results(Path(output_dir or "."), exit_code=USER_ERROR, error=str(e))
    given = ("output_dir", str(output_dir)) if output_dir is not None else (
        "hydra.run.dir", str(composed.hydra.run.dir))
    if problem := refused_output_dir(*given):
        return Results(Path("."), exit_code=USER_ERROR, error=problem)
    run_dir = Path(given[1])
    if (worker := non_chief(composed)) is not None:  # never in the chief's run dir
        run_dir = Path(own_dir(str(run_dir), worker))
    try:  # made first, as Hydra makes the command's, so a failure is recorded in it
        RunDir(run_dir).check_writable()
    except DistlabError as e:
        return Results(run_dir, exit_code=USER_ERROR, error=str(e))
    cfg = OmegaConf.masked_copy(composed, [k for k in composed if k != "hydra"])
    return run(cfg, run_dir, log_file=True)


def _compose(overrides: list[str], config_dir: str | Path | None = None,
             config_path: str | Path | None = None) -> DictConfig:
    """The composed config (with its `hydra` node), Hydra's errors as one DistlabError line.
    `config_dir` joins the search path as `hydra.searchpath` (where the command's
    `--config-dir` goes: after distlab's configs and plug-in packages'). A Hydra already set
    up in this process (a @hydra.main app, hydra.initialize) is put back afterwards."""
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        if config_dir is not None:
            overrides = _with_search_path(overrides, Path(config_dir).expanduser().resolve())
        context = (initialize_config_dir(str(Path(config_path).expanduser().resolve()),
                                         version_base="1.3")
                   if config_path is not None else
                   initialize_config_module("distlab.conf", version_base="1.3"))
        with context:
            return compose("config", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:  # as the command: one line
        raise DistlabError(composition_problem(e)) from None
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)


def _with_search_path(overrides: list[str], config_dir: Path) -> list[str]:
    """`overrides` with `file://<config_dir>` first in `hydra.searchpath` (joined to one the
    overrides already give: Hydra reads only the first)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    given: list[str] = []
    rest = []
    for text in overrides:
        if text.split("=", 1)[0].strip() == "hydra.searchpath":
            value = parser.parse_override(text).value()
            given += [str(v) for v in (value if isinstance(value, list) else [value])]
        else:
            rest.append(text)
    paths = ", ".join(hydra_value(p) for p in [f"file://{config_dir}", *given])
    return [*rest, f"hydra.searchpath=[{paths}]"]
