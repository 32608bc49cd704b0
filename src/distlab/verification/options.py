"""`distlab verify`'s own settings (`verify.<key>=value` among the run's overrides) and the
overrides that make a run brief. No TensorFlow here."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from distlab.errors import ConfigError
from distlab.records.run_dir import pattern_problem

CHECKS = ("data", "determinism", "replicas", "loops", "resume", "export", "workers")
DEFAULT_CHECKS = CHECKS[:-1]  # workers: opt-in (verify.workers=true)


@dataclass
class Options:
    """checks: the rows to run; steps: training steps each compared run takes; batch: the
    examples per replica (1 x 2B against 2 x B); rows: the test rows scored; dir: the
    scratch directory (default outputs/verify/<date>/<time>)."""

    checks: list[str] = field(default_factory=lambda: list(DEFAULT_CHECKS))
    steps: int = 3
    batch: int = 8
    rows: int = 100
    dir: Path | None = None
    workers: bool = False


def split_overrides(args: list[str]) -> tuple[list[str], Options]:
    """(the run's overrides, verify's options) from the command's arguments."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    options, overrides = Options(), []
    for text in args:
        key = text.split("=", 1)[0].strip().lstrip("+~")
        if not key.startswith("verify."):
            overrides.append(text)
            continue
        name = key.removeprefix("verify.")
        try:
            value = parser.parse_override(text.lstrip("+")).value()
        except Exception as e:  # noqa: BLE001 - Hydra's grammar error: one line
            raise ConfigError(f"{text}: not an override ({str(e).splitlines()[0]})") from None
        _set(options, name, value)
    if options.workers and "workers" not in options.checks:
        options.checks.append("workers")
    return overrides, options


def _set(options: Options, name: str, value: object) -> None:
    if name == "checks":
        checks = [str(v) for v in (value if isinstance(value, list) else [value])]
        unknown = [c for c in checks if c not in CHECKS]
        if not checks:
            raise ConfigError(f"verify.checks=[] names no check: give one or more of "
                              f"{', '.join(CHECKS)} (or leave verify.checks out: all but "
                              "workers)")
        if unknown:
            raise ConfigError(f"verify.checks={value}: {unknown[0]} is not a check; the "
                              f"checks: {', '.join(CHECKS)}")
        options.checks = checks
    elif name in ("steps", "batch", "rows"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1 \
                or (name == "steps" and value < 2):
            least = 2 if name == "steps" else 1
            raise ConfigError(f"verify.{name}={value}: must be an integer >= {least}")
        setattr(options, name, value)
    elif name == "workers":
        if not isinstance(value, bool):
            raise ConfigError(f"verify.workers={value}: must be true or false")
        options.workers = value
    elif name == "dir":
        if value is None or not str(value).strip():
            raise ConfigError("verify.dir is empty: give the directory verify's runs go to "
                              "(default outputs/verify/<date>/<time>)")
        if problem := pattern_problem(value):
            raise ConfigError(f"verify.dir={value}: {problem}")
        options.dir = Path(str(value)).expanduser()
    else:
        raise ConfigError(f"verify.{name} is not a setting of distlab verify; its settings: "
                          "verify.checks, verify.steps, verify.batch, verify.rows, "
                          "verify.workers, verify.dir")


def scratch_dir(options: Options) -> Path:
    """A fresh directory for this invocation's runs (verify.json goes there), created:
    outputs/verify/<date>/<time>, or a new <date>_<time> folder of `verify.dir` (so that a
    rerun with the same verify.dir reuses nothing of an earlier one)."""
    if options.dir is None:
        base, name = Path("outputs") / "verify" / time.strftime("%Y-%m-%d"), "%H-%M-%S"
    else:
        base, name = options.dir, "%Y-%m-%d_%H-%M-%S"
    stamp = time.strftime(name)
    what = f"verify.dir={options.dir}" if options.dir is not None else f"scratch directory {base}"
    if base.exists() and not base.is_dir():
        raise ConfigError(f"{what}: is a file, not a directory; give a directory")
    try:
        base.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            path = base / (stamp if n == 1 else f"{stamp}-{n}")
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    except OSError as e:
        raise ConfigError(f"{what}: cannot create a directory there ({e.strerror or e}); "
                          "give a writable directory") from None
    raise ConfigError(f"{what}: too many verify runs this second; give another directory")


SHUFFLE_BUFFER = 256  # at most: a brief run reads no more rows than it needs to start


def brief(options: Options, batch: int | None = None, shuffle_buffer: int | None = None
          ) -> list[str]:
    """Overrides that make a run brief: `options.steps` steps an epoch, 2 epochs, small
    batches, a small shuffle buffer (`shuffle_buffer`, the run's: at most SHUFFLE_BUFFER),
    no export (the export check makes its own), no progress bar, deterministic, no tracker
    but the run dir's TensorBoard logs (`logger=tensorboard`: nothing in the user's MLflow
    store; the user's `logger.*` overrides are left out: `without_logger`)."""
    buffer = min(SHUFFLE_BUFFER, SHUFFLE_BUFFER if shuffle_buffer is None else shuffle_buffer)
    return [f"trainer.steps_per_epoch={options.steps}", "trainer.epochs=2",
            f"dataset.batch_size_per_replica={batch or options.batch}",
            f"dataset.shuffle_buffer={buffer}", "trainer.export=false", "loop.verbose=0",
            "deterministic=true", "logger=tensorboard"]


def without_logger(overrides: list[str]) -> list[str]:
    """The run's overrides without those of the `logger` group (a brief run logs nowhere)."""
    return [o for o in overrides
            if not re.fullmatch(r"logger(\..*)?", o.split("=", 1)[0].strip().lstrip("+~"))]
