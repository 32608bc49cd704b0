"""Shared fixtures: a tiny prepared tfds data dir, Hydra composition, in-process and CLI runs."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import composition
import processes
import pytest
import tiers
import xdist_groups

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# the on-disk data cache (dataset.disk_cache) of this test session, not the user's
_CACHE = tempfile.TemporaryDirectory(prefix="distlab-test-cache-")
os.environ["DISTLAB_CACHE_DIR"] = _CACHE.name

from distlab.config import register_configs  # noqa: E402
from distlab.records.locks import locked  # noqa: E402

register_configs()
composition.install()  # two of Hydra's per-composition costs, without (tests/composition.py)
TINY_TRAIN, TINY_TEST = 512, 192


def _hypothesis_profiles() -> None:
    """Hypothesis (tests/test_config_properties.py): `ci`, the default, draws the same
    examples on every run (derandomized, no database: a failing example is kept as an
    `@example` of its test), reports a failing one as drawn (shrinking trains again and
    again) and has no deadline (TensorFlow's first traces are slow);
    HYPOTHESIS_PROFILE=explore draws new ones, 10 times as many, and keeps what fails in
    .hypothesis/."""
    from hypothesis import HealthCheck, Phase, settings

    slow = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
    settings.register_profile("ci", max_examples=30, derandomize=True, database=None,
                              deadline=None, print_blob=True, suppress_health_check=slow,
                              phases=[Phase.explicit, Phase.generate])  # (shrinking: explore)
    settings.register_profile("explore", max_examples=300, deadline=None, print_blob=True,
                              suppress_health_check=slow)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


_hypothesis_profiles()


def caller_chose_dist(config) -> bool:
    """Whether the command line, PYTEST_ADDOPTS or addopts name a --dist (-d) of their own."""
    given = [*config.invocation_params.args, os.environ.get("PYTEST_ADDOPTS", ""),
             *config.getini("addopts")]
    return any(a.startswith(("--dist", "-d")) for arg in given for a in str(arg).split())


def pytest_configure(config):
    """Three logical CPUs for the whole session (must happen before any TF op), so in-process
    tests can use strategy.cpu_devices=1, 2 or 3. SIGINT handled as Python's default even when
    the suite was started ignoring it (a background job of a non-interactive shell, nohup):
    an ignored signal is inherited, and distlab keeps a signal its process was started
    ignoring ignored, so the tests that send SIGINT to a run or a sweep would send it to
    processes that cannot hear it. A handler is not inherited: they start with the default."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # `-n N` without a --dist of the caller's: xdist's loadgroup, which hands out the tests
    # one at a time in the order below (an xdist_group's all to one worker: the Ray tests'
    # shared instance, the wheel), instead of load's
    # first chunks of ~50 consecutive tests per worker
    if (config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") == "load"
            and not caller_chose_dist(config)):
        config.option.dist = "loadgroup"
    # a worker parses the command line again (xdist 3.8), so it is told of the loadgroup
    # above (pytest_configure_node): without it, its tests' ids carry no group; and on
    # pytest 9.2 the group xdist appends to an id needs tests/xdist_groups.py
    if getattr(config, "workerinput", {}).get("distlab_loadgroup"):
        config.option.loadgroup = True
        config.pluginmanager.register(xdist_groups, "distlab-xdist-groups")
    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        return  # xdist's controller runs no test: TensorFlow is its workers' (it starts them)
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
    # start the runtime now: until then a job's own strategy.cpu_devices=1 would replace the
    # three (the first test of a worker, e.g. `-n 2 tests/test_keras_oracle.py`)
    assert len(tf.config.list_logical_devices("CPU")) == 3


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist's controller, for each worker it starts: whether the tests are handed out by
    group (pytest_configure), and where to leave what it finds about the tiers."""
    node.workerinput["distlab_loadgroup"] = node.config.getoption("dist") == "loadgroup"
    node.workerinput["distlab_tiers_dir"] = str(_tiers_dir(node.config))


def pytest_addoption(parser):
    parser.addoption(
        "--exhaustive", action="store_true",
        help="also run the exhaustive tier (tests/tiers.py: the tests the suite leaves out; "
             "CI runs them after the suite); `-m exhaustive` runs only those")


def runs_exhaustive(config) -> bool:
    """Whether this session runs the whole exhaustive tier: `--exhaustive`, or a `-m`
    expression that names the marker. (A test of the tier asked for by id, or one that
    failed last time under --lf, runs either way: `_asked_for`.)"""
    return config.getoption("exhaustive") or "exhaustive" in (config.getoption("markexpr") or "")


_TIERS_DIR = pytest.StashKey[Path]()
_LEFT_OUT = pytest.StashKey[int]()


def _tiers_dir(config) -> Path:
    """The xdist controller's folder for what its workers find about the tiers."""
    if _TIERS_DIR not in config.stash:
        config.stash[_TIERS_DIR] = Path(tempfile.mkdtemp(prefix="distlab-tiers-"))
    return config.stash[_TIERS_DIR]


def _named(config) -> list[tuple[Path, str]]:
    """The tests the command line asks for by id: (file, the id's part after `file::`)."""
    named = []
    for arg in map(str, config.args):
        if "::" in arg:
            path, rest = arg.split("::", 1)
            named.append(((config.invocation_params.dir / path).resolve(), rest))
    return named


def _asked_for(item, named: list[tuple[Path, str]], failed: dict) -> bool:
    """Whether a test was asked for by id (its function, class or itself), or under --lf
    failed last time."""
    rest = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else ""
    return item.nodeid in failed or any(
        item.path.resolve() == path and (rest == part or rest.startswith((part + "[",
                                                                          part + "::")))
        for path, part in named)


def _narrowed(config, named: list[tuple[Path, str]]) -> set[str]:
    """The files (names) of which the command line asks for some tests by id, and that no
    other argument (the file, a folder above it) gives whole."""
    given = [(config.invocation_params.dir / str(arg)).resolve() for arg in config.args
             if "::" not in str(arg)]
    return {path.name for path, _ in named
            if not any(path == g or g in path.parents for g in given)}


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(config, items):
    """The exhaustive tier (tests/tiers.py) marked `exhaustive`, and left out unless asked
    for; a name there that no test has stops the session (`tiers.problems`). Under xdist,
    the longest tests first, so that the last ones to finish are short: the multi-process
    tests, then the other slow ones, then the fast tier (a stable sort: file order within
    each)."""
    named = _named(config)
    cache = getattr(config, "cache", None)
    failed = (cache.get("cache/lastfailed", {})
              if cache is not None and config.getoption("lf", False) else {})
    seen: dict[str, set[str | None]] = {}
    for item in items:
        key = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        variant = item.callspec.id if hasattr(item, "callspec") else None
        seen.setdefault(key, set()).add(variant)
        if tiers.exhaustive(key, variant):
            item.add_marker(pytest.mark.exhaustive)
    whole = set() if failed else {key.split("::")[0] for key in seen} - _narrowed(config, named)
    found = tiers.problems(seen, whole)
    if found and hasattr(config, "workerinput"):  # the controller stops the session
        (Path(config.workerinput["distlab_tiers_dir"]) / "problem").write_text(found[0])
        return
    if found:
        raise pytest.UsageError(found[0])
    if not runs_exhaustive(config):
        left = [item for item in items if item.get_closest_marker("exhaustive")
                and not _asked_for(item, named, failed)]
        if left:
            config.hook.pytest_deselected(items=left)
            leaving = set(left)
            items[:] = [item for item in items if item not in leaving]
        config.stash[_LEFT_OUT] = len(left)
        if hasattr(config, "workerinput"):
            (Path(config.workerinput["distlab_tiers_dir"]) / "left").write_text(str(len(left)))
    if hasattr(config, "workerinput"):  # an xdist worker: its order is the one handed out
        items.sort(key=lambda item: 0 if item.get_closest_marker("multiprocess")
                   else 1 if item.get_closest_marker("slow") else 2)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """xdist's controller: a worker's tiers problem (pytest_collection_modifyitems) stops the
    session in one line, before any test runs."""
    problem = _tiers_dir(node.config) / "problem"
    if problem.is_file():
        raise pytest.UsageError(problem.read_text())


def pytest_terminal_summary(terminalreporter, config):
    """How many tests of the exhaustive tier the files collected hold that this session left
    out (before `-m` and `-k` chose among them), and how to run them."""
    left = config.stash.get(_LEFT_OUT, None)
    if left is None and _TIERS_DIR in config.stash:
        count = config.stash[_TIERS_DIR] / "left"
        left = int(count.read_text()) if count.is_file() else None
    if left:
        tests = "1 test" if left == 1 else f"{left} tests"
        terminalreporter.write_line(f"the exhaustive tier (tests/tiers.py) left out: {tests} "
                                    "in the files collected; --exhaustive or -m exhaustive "
                                    "runs them")


def pytest_unconfigure(config):
    if _TIERS_DIR in config.stash:
        shutil.rmtree(config.stash[_TIERS_DIR], ignore_errors=True)


def pytest_collection_finish(session):
    """What is alive once the tests are collected (TensorFlow, Keras, Hydra, the test modules:
    ~500,000 objects) frozen out of the garbage collector's walks (gc.freeze): a full
    collection, which Keras' clear_session runs at every distlab run and Python runs as objects
    pile up, then walks only what the tests made (0.5 s each on the CI machine, before)."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _fast_tier_trains_nothing(request):
    """The fast tier (`-m "not slow"`) trains nothing: in a test without the `slow` marker an
    optimizer update, `Model.fit` or `Model.train_on_batch` fails the test (mark it slow),
    and so does a `run.py` forked from the TensorFlow-preloaded server (tests/processes.py;
    starting it costs a TensorFlow import). The fast tier's `run.py` processes are fresh
    interpreters that are refused before TensorFlow."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    import keras

    calls: list[str] = []

    def forbidden(name: str):
        def call(*args, **kwargs):
            calls.append(name)
            raise RuntimeError(f"{name} in a test not marked slow (the fast tier trains "
                               "nothing and starts no TensorFlow process): mark it "
                               "@pytest.mark.slow")
        return call

    with pytest.MonkeyPatch.context() as mp:  # its own: a test's monkeypatch.undo() keeps it
        mp.setattr(keras.optimizers.Optimizer, "apply", forbidden("an optimizer update"))
        mp.setattr(keras.Model, "fit", forbidden("Model.fit"))
        mp.setattr(keras.Model, "train_on_batch", forbidden("Model.train_on_batch"))
        mp.setattr(processes, "_forkserver", forbidden("a run.py forked from the TensorFlow-"
                                                       "preloaded server"))
        yield
    if calls:  # also when the code under test caught the error (a run reports it as failed)
        pytest.fail(f"{request.node.nodeid} is not marked slow but runs {calls[0]}")


def _write_tiny(name: str, data_dir: Path) -> None:
    """A learnable tiny dataset in tfds' own on-disk format, read back by tfds' real builder."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(0)

    def split(n: int) -> tf.data.Dataset:
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28, 1)).astype(np.uint8)
        for i, label in enumerate(labels):  # a bright bar whose row encodes the label
            images[i, 2 + 2 * label : 4 + 2 * label, 4:24, 0] = 250
        return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})

    features = tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(28, 28, 1)),
        "label": tfds.features.ClassLabel(num_classes=10),
    })
    tfds.dataset_builders.TfDataBuilder(
        name=name, version="3.0.1", features=features, data_dir=str(data_dir),
        split_datasets={"train": split(TINY_TRAIN), "test": split(TINY_TEST)},
    ).download_and_prepare()


def _write_tiny_cifar10(data_dir: Path, n_train: int = 256, n_test: int = 64) -> None:
    """CIFAR-10-shaped data under tfds' real `cifar10` name, version and features."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(1)

    def split(n: int, prefix: str) -> tf.data.Dataset:
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 80, (n, 32, 32, 3)).astype(np.uint8)
        for i, label in enumerate(labels):  # a coloured square whose place encodes the label
            images[i, 3 * label : 3 * label + 6, 8:20, label % 3] = 240
        ids = [f"{prefix}_{i:05d}" for i in range(n)]
        return tf.data.Dataset.from_tensor_slices({"id": ids, "image": images, "label": labels})

    features = tfds.features.FeaturesDict({
        "id": tfds.features.Text(),
        "image": tfds.features.Image(shape=(32, 32, 3)),
        "label": tfds.features.ClassLabel(num_classes=10),
    })
    tfds.dataset_builders.TfDataBuilder(
        name="cifar10", version="3.0.2", features=features, data_dir=str(data_dir),
        split_datasets={"train": split(n_train, "train"), "test": split(n_test, "test")},
    ).download_and_prepare()


TINY_REGRESSION_FEATURES = 6


def _write_tiny_regression(data_dir: Path) -> None:
    """A tfds dataset with its own feature names and a float label: y = x . w + noise."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(2)
    w = rng.normal(size=TINY_REGRESSION_FEATURES).astype(np.float32)

    def split(n: int) -> tf.data.Dataset:
        x = rng.normal(size=(n, TINY_REGRESSION_FEATURES)).astype(np.float32)
        y = (x @ w + 0.1 * rng.normal(size=n)).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices({"measurements": x, "target": y})

    features = tfds.features.FeaturesDict({
        "measurements": tfds.features.Tensor(shape=(TINY_REGRESSION_FEATURES,),
                                             dtype=np.float32),
        "target": tfds.features.Tensor(shape=(), dtype=np.float32),
    })
    tfds.dataset_builders.TfDataBuilder(
        name="tiny_regression", version="1.0.0", features=features, data_dir=str(data_dir),
        split_datasets={"train": split(TINY_TRAIN), "test": split(TINY_TEST)},
    ).download_and_prepare()


def _shared_temp(tmp_path_factory) -> Path:
    """The session's base temporary directory, the same for every xdist worker (popen-gwN's
    parent under xdist)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def tiny_dataset(data_dir: Path, name: str, write) -> None:
    """`write(data_dir)` unless `name` is already prepared there (by this or another xdist
    worker: under a lock, marked done once written)."""
    done = data_dir / f".{name}.done"
    with locked(data_dir / f".{name}.lock"):
        if not done.exists():
            write(data_dir)
            done.write_text("")


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """The tiny datasets in tfds' format, written once per test session: the xdist workers
    share them (the first to ask writes, under a lock; the others read)."""
    data_dir = _shared_temp(tmp_path_factory) / "tfds"
    data_dir.mkdir(exist_ok=True)
    for name in ("mnist", "fashion_mnist"):
        tiny_dataset(data_dir, name, functools.partial(_write_tiny, name))
    tiny_dataset(data_dir, "cifar10", _write_tiny_cifar10)
    tiny_dataset(data_dir, "tiny_regression", _write_tiny_regression)
    return data_dir


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory):
    """mlflow_store(path) -> the URI of a new SQLite MLflow store at `path`: a copy of one
    whose schema MLflow has made (its ~30 migrations cost ~3 CPU-s a store), made once per
    test session for every xdist worker. A test whose subject is a new store's creation
    makes its own."""
    import shutil

    template = _shared_temp(tmp_path_factory) / "mlflow-template.db"
    with locked(template.with_suffix(".lock")):
        if not template.exists():
            from mlflow.tracking import MlflowClient

            made = template.with_suffix(".making.db")
            MlflowClient(f"sqlite:///{made}").search_experiments()
            made.rename(template)

    def _copy(path: Path) -> str:
        shutil.copyfile(template, path)
        return f"sqlite:///{path}"

    return _copy


def benchmark_module(name: str):
    """benchmarks/<name>.py, loaded from its file as `bench_<name>` (benchmarks/ is not put on
    the session's path: its modules' names would shadow others)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  ROOT / "benchmarks" / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fast_overrides(data_dir: Path) -> list[str]:
    return [f"dataset.data_dir={data_dir}", "trainer.epochs=2", "loop.verbose=0",
            "trainer.export=false", "dataset.shuffle_buffer=512"]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=overrides)


@functools.cache
def _composed_once(overrides: tuple[str, ...]):
    return compose(list(overrides))


def compose_once(overrides: list[str]):
    """As compose (a copy, the test's own), composed once per distinct list of overrides in
    this process: for configs of conf/ and distlab's schemas alone (Hydra's composition costs
    ~0.2 s), not for a test that changes what Hydra reads (a YAML it writes, a search path)."""
    assert not any(o.startswith("hydra.searchpath") for o in overrides), overrides
    return copy.deepcopy(_composed_once(tuple(overrides)))


@pytest.fixture
def run_inprocess(tiny_data_dir, tmp_path):
    """Run distlab in this process; return the run's results.json as a dict (a run that did
    not complete raises SystemExit with its status, as the command exits)."""
    import distlab

    counter = iter(range(1000))

    def _run(*overrides: str, out: Path | None = None) -> dict:
        out = out or tmp_path / f"run{next(counter)}"
        results = distlab.run(compose(fast_overrides(tiny_data_dir) + list(overrides)),
                              output_dir=out)
        if results.exit_code:  # as the `distlab` command ends a single run
            raise SystemExit(results.exit_code)
        return json.loads((out / "results.json").read_text())

    return _run


@pytest.fixture(scope="session")
def run_once(tiny_data_dir, tmp_path_factory):
    """run_once(*overrides) -> (results.json as a dict, run dir): as run_inprocess, but each
    distinct list of overrides trains once per test session, for tests that only read the
    run (results, history, checkpoints). The runs are kept in the session's base temporary
    directory, which the xdist workers share: the first to ask trains (under a file lock),
    the others read its run."""
    import hashlib

    import distlab

    root = _shared_temp(tmp_path_factory) / "run_once"
    root.mkdir(exist_ok=True)

    def _run(*overrides: str) -> tuple[dict, Path]:
        out = root / hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:16]
        with locked(Path(f"{out}.lock")):
            done = out / "results.json"
            if not (done.exists() and json.loads(done.read_text())["status"] == "completed"):
                results = distlab.run(compose(fast_overrides(tiny_data_dir) + list(overrides)),
                                      output_dir=out)
                if results.exit_code:
                    raise SystemExit(results.exit_code)
            return json.loads(done.read_text()), out

    return _run


def run_command(*args: str, timeout: float = 60, cwd: Path = ROOT,
                ) -> tuple[subprocess.CompletedProcess, bool]:
    """`python run.py ARGS` in a fresh interpreter, from `cwd`: the process (its exit status
    is the command's) and whether TensorFlow was imported by the time the command ended (what
    a refusal "before TensorFlow" means, whatever the machine's speed)."""
    run_py = str(ROOT / "run.py")
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{run_py!r}, *{list(args)!r}]\n"
        "status = 0\n"
        f"try:\n    runpy.run_path({run_py!r}, run_name='__main__')\n"
        "except SystemExit as e:\n    status = e.code\n"
        "print('TENSORFLOW_IMPORTED' if 'tensorflow' in sys.modules else 'NO_TENSORFLOW',\n"
        "      file=sys.stderr)\n"
        "sys.exit(status)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                         timeout=timeout)
    tensorflow = out.stderr.rstrip().splitlines()[-1:]
    assert tensorflow in (["TENSORFLOW_IMPORTED"], ["NO_TENSORFLOW"]), out.stdout + out.stderr
    out.stderr = out.stderr.rstrip().rpartition("\n")[0]  # without the marker line
    return out, tensorflow == ["TENSORFLOW_IMPORTED"]


class _RefuseRunner:
    """A finder that refuses `distlab.training.runner` (the module that imports TensorFlow
    and loads the data) and records that a job asked for it."""

    def __init__(self) -> None:
        self.asked = False

    def find_spec(self, name, path=None, target=None):
        if name == "distlab.training.runner":
            self.asked = True
            raise ImportError("distlab.training.runner imported before the refusal")
        return None


@contextlib.contextmanager
def runner_refused() -> Iterator[_RefuseRunner]:
    """Within: importing `distlab.training.runner` fails (an already imported one is set
    aside and put back after); the guard's `asked` says whether anything tried."""
    guard = _RefuseRunner()
    saved = sys.modules.pop("distlab.training.runner", None)
    sys.meta_path.insert(0, guard)
    try:
        yield guard
    finally:
        sys.meta_path.remove(guard)
        if saved is not None:
            sys.modules["distlab.training.runner"] = saved


def refusal_in_process(out: Path, *overrides: str) -> str:
    """The error of a job this process runs as `python run.py OVERRIDES` would (composition
    with Hydra's error turned into distlab's one line, then `distlab.run`), asserting it is
    refused before distlab's TensorFlow side is imported (in a process that already has
    TensorFlow: so without timing the command)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    import distlab
    from distlab.config.checks import composition_problem

    try:
        cfg = compose(list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        return composition_problem(e)
    with runner_refused() as guard:
        results = distlab.run(cfg, output_dir=out)
    assert not guard.asked, f"{overrides}: TensorFlow's side imported before the refusal"
    assert results.exit_code == 2, (results.exit_code, results.error)
    assert "\n" not in results.error and "Traceback" not in results.error, results.error
    return results.error


def run_cli(*args: str, timeout: float = 300, env: dict | None = None, fresh: bool = False,
            ) -> subprocess.CompletedProcess:
    """`python run.py ARGS` from the repository root (a process forked from a preloaded
    interpreter: tests/processes.py; `fresh`: a new interpreter)."""
    return processes.run("run.py", *args, timeout=timeout, env=env,
                         fresh=fresh or processes.FRESH)


class Gated:
    """`python tests/gate.py ARGS hydra.run.dir=RUN_DIR` (run.py with a test-only gate, see
    tests/gate.py): `wait()` until the run reaches the gate, `signal(n)` it there (the gate
    is released once the signal is sent), `finish()` -> (exit status, output). The process
    is killed on expiry or when the test fails."""

    def __init__(self, args: list[str], run_dir: Path, gate: str, folder: Path,
                 step_sleep: float = 0.0, env: dict | None = None, timeout: float = 240):
        folder.mkdir(parents=True, exist_ok=True)
        for mark in ("reached", "released"):  # an earlier run's at the same gate
            (folder / mark).unlink(missing_ok=True)
        self.folder, self.timeout = folder, timeout
        gate_env = {"DISTLAB_TEST_GATE": gate, "DISTLAB_TEST_GATE_DIR": str(folder),
                    "DISTLAB_TEST_STEP_SLEEP": str(step_sleep)}
        self.proc = processes.Process(ROOT / "tests" / "gate.py", *args,
                                      f"hydra.run.dir={run_dir}", env={**gate_env, **(env or {})})

    def wait(self) -> None:
        """Until the run is held at its gate (an event, whatever the machine's speed)."""
        import time

        expiry = time.monotonic() + self.timeout
        while not (self.folder / "reached").exists():
            if self.proc.poll() is not None or time.monotonic() > expiry:
                self.proc.kill()
                raise AssertionError("the run never reached its gate:\n"
                                     + self.proc.communicate()[0][-3000:])
            time.sleep(0.02)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)
        (self.folder / "released").write_text("")

    def finish(self) -> tuple[int, str]:
        try:
            output = self.proc.communicate(timeout=self.timeout)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            output = self.proc.communicate()[0] + "\n<killed: timeout>"
        return self.proc.returncode, output

    def __enter__(self) -> Gated:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def signal_at(args: list[str], run_dir: Path, gate: str, signum: int | None = None,
              step_sleep: float = 0.0, env: dict | None = None) -> tuple[int, str]:
    """Run `python run.py ARGS hydra.run.dir=RUN_DIR`, send `signum` (SIGTERM) when it reaches
    `gate` (tests/gate.py: `step:E:S` or `stage:NAME`); (exit status, output)."""
    import signal

    with Gated(args, run_dir, gate, run_dir.parent / f"{run_dir.name}-gate", step_sleep,
               env) as gated:
        gated.wait()
        gated.signal(signal.SIGTERM if signum is None else signum)
        return gated.finish()


def stop_at(monkeypatch, epoch: int, step: int) -> None:
    """As a SIGTERM would: ask for a stop after step `step` of epoch `epoch` (0-based)."""
    import signal

    from distlab.training.controller import Controller

    original = Controller.step_end

    def step_end(self, e, steps_done, loss):
        if (e, steps_done) == (epoch, step):
            self.stop.signum = signal.SIGTERM
        original(self, e, steps_done, loss)

    monkeypatch.setattr(Controller, "step_end", step_end)
