"""Every snippet of README.md, of the documentation site (docs/**/*.md, but for the two
records named in readme_snippets.RECORDS) and of examples/*/README.md runs, so one that rots
fails CI.

The blocks are found generically (tests/readme_snippets.py: markdown-it-py), so a block added
or changed is tested as it stands. The fast tier composes and checks every `python run.py` /
`distlab` command in this process, as the command does before TensorFlow trains (each value
of a sweep too), lints every Python block for names it never defines, and checks that no
command word would be globbed by a shell. The slow tier runs every single-run command with
a few steps on tiny data (`distlab.train`, with the command's `--config-dir`), and every
Python block a user would paste. The blocks of README.md and the site's pages run from one
project made of their `# my_project/...` files, an example's from its directory; a command
that README.md and a page both show is composed and trained once. What cannot run here is
listed below, each with its reason.
"""

from __future__ import annotations

from itertools import count
from pathlib import Path

import pytest
from conftest import ROOT
from readme_snippets import (
    FRAGMENT_PREAMBLE,
    PLACEHOLDER,
    PROJECT_DOCS,
    Block,
    Command,
    all_blocks,
    commands,
    undefined_names,
    unquoted_glob,
    user_code_sandbox,
)

# blocks (found by a piece of their text) that cannot run here, and why
SKIPPED_BLOCKS = {
    'DataSplits(train=({"measurements": floats[n, 27]':
        "the shape of what data.py's builder returns, not code",
    "lookup = keras.layers.StringLookup()":
        "an excerpt of models.py:two_inputs (test_example_project.py trains it)",
    "served(measurements=tf.constant(floats":
        "needs the user's own rows (floats); test_example_project.py serves that SavedModel",
    "words = keras.layers.TextVectorization":
        "an excerpt of models.py:bag_of_ngrams (test_example_project.py trains it)",
}
# commands (found by a piece of their text) that are not composed or run here, and why
SKIPPED_COMMANDS = {
    "experiment=moons": "needs examples/plugin_package installed (tests/test_package.py "
                        "installs it and runs experiment=moons)",
    "distlab --info searchpath": "lists the installed plug-in packages (tests/test_package.py)",
    "strategy.workers=2": "the command starts worker processes or Ray actors of its own "
                          "(tests/test_worker_launchers.py runs both)",
    "hydra/launcher=ray": "starts a Ray instance (tests/test_worker_launchers.py runs a sweep "
                          "on the Ray launcher, in the exhaustive tier)",
}
NOT_DISTLAB = {  # other programs a README shows, and why a test does not run them
    "pip": "installs packages (CI installs the checkout; tests/test_package.py the wheel)",
    "python -m pip": "installs packages (CI installs the checkout with this command)",
    "export": "sets the shell's environment",
    "cd": "changes the shell's directory (each test runs from its own)",
    "mlflow": "starts the MLflow UI server",
    "saved_model_cli": "needs a run's SavedModel and an input file (tests/test_inputs.py "
                       "runs saved_model_cli on exported models)",
    "tensorboard": "starts a server",
    "python -m pytest": "the test suite itself (CI runs it)",
}
NOT_TRAINED = {  # single runs that are composed and checked but not trained here
    "TF_CONFIG": "a multi-worker run needs its peers (tests/test_multiworker.py runs two)",
    "SRUN": "needs a SLURM allocation",
}

BLOCKS = all_blocks()
COMMANDS = [c for b in BLOCKS if b.kind == "shell" for c in commands(b)]


def _project(doc: Path) -> Path:
    """Where a doc's snippets run (see project_of): README.md and the site share one."""
    return ROOT if doc in PROJECT_DOCS else doc.parent


def _once(commands: list[Command]) -> list[Command]:
    """A command shown in several docs of one project (README.md and a page) once."""
    seen: set = set()
    return [c for c in commands if (_project(c.block.doc), c.text) not in seen
            and not seen.add((_project(c.block.doc), c.text))]


DISTLAB = _once([c for c in COMMANDS if c.is_distlab
                 and not any(n in c.text for n in SKIPPED_COMMANDS)])
PYTHON = [b for b in BLOCKS if b.kind == "python"
          and not any(n in b.text for n in SKIPPED_BLOCKS)]
PY_FILES = [(b, path, text) for b in BLOCKS if b.kind == "files"
            for path, text in b.files.items() if path.endswith(".py")]


@pytest.fixture(autouse=True)
def _without_the_tests_own_registrations():
    """A snippet registers names (`clip_per_replica`) that the suite's own plug-in modules
    (tests/user_loops.py ...) may have registered in this process already: set those aside
    while a snippet runs, as a user's fresh process would not have them."""
    from distlab import registry

    own = ("user_loops", "user_inputs", "callback_recorder")
    groups = [r for r in vars(registry).values() if isinstance(r, registry.Registry)]
    aside = {}
    for group in groups:
        names = [n for n, origin in group._origin.items() if origin.split(":")[0] in own]
        aside[group] = {n: (group._items.pop(n), group._origin.pop(n)) for n in names
                        if n in group._items}
    yield
    for group, entries in aside.items():
        for name, (item, origin) in entries.items():
            group._items.setdefault(name, item)
            group._origin.setdefault(name, origin)


def _ids(items) -> list[str]:
    return [getattr(i, "id", None) or getattr(i, "where", None) or f"{i[0].where}:{i[1]}"
            for i in items]


# ---------------------------------------------------------------------------- where

def project_of(doc: Path, tmp: Path) -> Path:
    """Where a doc's snippets run: an example's own directory; for README.md and the site's
    pages, a project made of their `# my_project/...` file blocks (code and conf/ YAMLs) in
    `tmp`."""
    if doc not in PROJECT_DOCS:
        return doc.parent
    project = tmp / "my_project"
    for block in BLOCKS:
        if block.doc in PROJECT_DOCS and block.kind == "files":
            for path, text in block.files.items():
                if path.startswith("my_project/"):
                    target = project / path.removeprefix("my_project/")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
    project.mkdir(exist_ok=True)
    return project


def few_steps(command_overrides: list[str], data_dir: Path) -> list[str]:
    """Appended to a training command: one epoch of a few steps on the tiny tfds data, on
    one CPU device unless the command chooses its strategy (tracing for 3 costs twice)."""
    accum = max([int(o.partition("=")[2]) for o in command_overrides
                 if o.startswith("trainer.grad_accum_steps=")] or [1])
    one_device = ([] if any(o.startswith("strategy") for o in
                            command_overrides) else ["strategy.cpu_devices=1"])
    return ["trainer.epochs=1", f"trainer.steps_per_epoch={max(2, accum)}",
            "trainer.export=false", "loop.verbose=0", f"dataset.data_dir={data_dir}",
            *one_device]


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """A sweep's jobs to check: every value of each swept key once (the other keys at their
    first value); a plain list of overrides is one job."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    swept = {}
    for i, text in enumerate(overrides):
        parsed = parser.parse_override(text)
        if parsed.is_sweep_override():
            swept[i] = [f"{parsed.get_key_element()}={v}"
                        for v in parsed.sweep_string_iterator()]
    first = [swept[i][0] if i in swept else o for i, o in enumerate(overrides)]
    jobs = [first]
    for i, values in swept.items():
        jobs += [[*first[:i], v, *first[i + 1:]] for v in values[1:]]
    return jobs


def concrete(overrides: list[str], tmp: Path) -> list[str]:
    """Placeholders (`ckpt_path=<run dir>`, `outputs/<date>/<time>`) made paths."""
    return [PLACEHOLDER.sub("x", o).replace("outputs/x/x", str(tmp / "a_run"))
            .replace("=x", f"={tmp / 'a_run'}") for o in overrides]


# ------------------------------------------------------------------------- fast tier

def test_the_docs_have_snippets_and_every_skip_still_matches():
    assert len(DISTLAB) > 30 and PYTHON and PY_FILES
    texts = [b.text for b in BLOCKS]
    for needle in [*SKIPPED_BLOCKS, *SKIPPED_COMMANDS]:
        assert any(needle in t for t in texts), f"skip-list entry {needle!r} matches no block"
    for command in COMMANDS:
        if not command.is_distlab:
            program = (" ".join(command.argv[:3]) if command.argv[:2] == ["python", "-m"]
                       else command.program)
            assert program in NOT_DISTLAB, (
                f"{command.id}: {program!r} is neither run nor skipped with a reason")


@pytest.mark.parametrize("command", COMMANDS, ids=_ids(COMMANDS))
def test_no_command_word_is_globbed_by_a_shell(command: Command):
    """`[`, `*` and `?` outside quotes are the shell's: zsh stops ("no matches found")."""
    assert unquoted_glob(command.text) == [], (
        f"{command.id}: quote these words: {unquoted_glob(command.text)}")


@pytest.mark.parametrize("block", PYTHON, ids=_ids(PYTHON))
def test_python_blocks_define_what_they_use(block: Block):
    """Pasted as it is (a fragment: after the imports of the file it belongs to), a block
    uses no name it never defines (e.g. `tf` without `import tensorflow as tf`)."""
    code = FRAGMENT_PREAMBLE + block.text if block.is_fragment else block.text
    assert undefined_names(code) == set(), f"{block.where} uses undefined names"


@pytest.mark.parametrize("item", PY_FILES, ids=_ids(PY_FILES))
def test_python_files_define_what_they_use_and_import(item, tmp_path, monkeypatch):
    block, path, text = item
    assert undefined_names(text) == set(), f"{block.where} {path} uses undefined names"
    module = tmp_path / Path(path).name
    module.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    with user_code_sandbox(tmp_path):
        __import__(module.stem)  # registers its names, inside the sandbox


@pytest.mark.parametrize("command", DISTLAB, ids=_ids(DISTLAB))
def test_distlab_command_composes_and_passes_the_checks(command: Command, tiny_data_dir,
                                                       tmp_path, monkeypatch):
    """Composed as the command composes it (its --config-dir too), each sweep value once,
    then checked as a job checks it before TensorFlow trains: Hydra's grammar (quoting),
    the groups, the schema and value rules, user code imported and every name resolved."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from distlab import plugins
    from distlab.config import validate
    from distlab.launch.api import _compose
    from distlab.tracking import session as tracking

    project = project_of(command.block.doc, tmp_path)
    monkeypatch.chdir(project)
    with user_code_sandbox(project, tmp_path):
        for job in sweep_jobs(concrete(command.overrides, tmp_path)):
            composed = _compose([*job, f"dataset.data_dir={tiny_data_dir}"],
                                command.config_dir, ROOT / "conf")
            with open_dict(composed):  # the command's runtime: ${hydra:...} resolves
                composed.hydra.runtime.output_dir = str(tmp_path / "run")
            HydraConfig.instance().set_config(composed)
            try:
                cfg = OmegaConf.masked_copy(composed, [k for k in composed if k != "hydra"])
                validate(cfg)
                plugins.check(cfg)
                tracking.build(cfg)
            finally:
                HydraConfig.instance().cfg = None


# ------------------------------------------------------------------------- slow tier

def _defaults() -> set[str]:
    """`group=option` for conf/config.yaml's default options (`loop=keras_fit`, ...)."""
    from omegaconf import OmegaConf

    entries = OmegaConf.load(ROOT / "conf" / "config.yaml").defaults
    return {f"{k}={v}" for e in entries if not isinstance(e, str) for k, v in e.items()}


def _distinct(commands: list[Command]) -> list[Command]:
    """One command per run: the same overrides (beside the defaults and what few_steps
    sets) from the same directory run once (`python run.py` is `python run.py
    loop=keras_fit dataset=mnist`; `distlab X` is `python path/to/run.py X`)."""
    ours, defaults, seen, out = ("trainer.epochs=", "trainer.steps_per_epoch=",
                                 "trainer.export=", "loop.verbose=", "dataset.data_dir=",
                                 "hydra.run.dir="), _defaults(), set(), []
    for command in commands:
        key = (_project(command.block.doc), command.config_dir, tuple(sorted(
            o for o in command.overrides if o not in defaults and not o.startswith(ours))))
        if key not in seen:
            seen.add(key)
            out.append(command)
    return out


TRAINING = _distinct([c for c in DISTLAB if c.trains])


@pytest.mark.slow
@pytest.mark.parametrize("command", TRAINING, ids=_ids(TRAINING))
def test_distlab_command_trains_a_few_steps(command: Command, tiny_data_dir, tmp_path,
                                            monkeypatch):
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    import distlab
    from distlab.launch.api import _compose

    if reason := next((r for k, r in NOT_TRAINED.items() if k in command.env), None):
        pytest.skip(reason)
    project = project_of(command.block.doc, tmp_path)
    monkeypatch.chdir(project)
    runs = count()

    def train(overrides: list[str]) -> distlab.Results:
        out = tmp_path / "outputs" / f"run{next(runs)}"
        results = distlab.train([*overrides, *few_steps(overrides, tiny_data_dir)],
                                config_dir=command.config_dir, config_path=ROOT / "conf",
                                output_dir=out)
        assert results.ok and results["status"] == "completed", (command.id, results)
        return results

    overrides = command.overrides
    with user_code_sandbox(project, tmp_path):
        if any("${hydra:" in o for o in overrides):  # resolved in the command's Hydra runtime
            out = tmp_path / "outputs" / "hydra"
            composed = _compose([*overrides, *few_steps(overrides, tiny_data_dir)],
                                command.config_dir, ROOT / "conf")
            with open_dict(composed):
                composed.hydra.runtime.output_dir = str(out)
            HydraConfig.instance().set_config(composed)
            try:
                cfg = OmegaConf.masked_copy(composed, [k for k in composed if k != "hydra"])
                OmegaConf.resolve(cfg)
            finally:
                HydraConfig.instance().cfg = None
            results = distlab.run(cfg, out)
            assert results.ok and results["status"] == "completed", (command.id, results)
            return
        if "mode=evaluate" in overrides:  # first train what it evaluates
            trained = train([o for o in overrides if not o.startswith(
                ("mode=", "ckpt_path=", "strategy="))])
            overrides = [f"ckpt_path={trained.run_dir}" if o.startswith("ckpt_path=") else o
                         for o in overrides]
        train(overrides)


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTHON, ids=_ids(PYTHON))
def test_python_block_runs(block: Block, tiny_data_dir, tmp_path, monkeypatch):
    """Pasted into Python from the doc's project: a `distlab.train` call trains a few steps
    on the tiny data; `outputs/<date>/<time>` is a run of the doc's first command (exported);
    every `distlab.Results` the block keeps is ok."""
    import distlab

    project = project_of(block.doc, tmp_path)
    monkeypatch.chdir(project)
    real_train = distlab.train

    def train(overrides=(), config_dir=None, output_dir=None, **kwargs):
        overrides = list(overrides)
        return real_train([*overrides, *few_steps(overrides, tiny_data_dir)], config_dir,
                          output_dir, config_path=ROOT / "conf")

    code = FRAGMENT_PREAMBLE + block.text if block.is_fragment else block.text
    with user_code_sandbox(project, tmp_path):
        if "outputs/<date>/<time>" in code:
            first = next(c for c in TRAINING
                         if _project(c.block.doc) == _project(block.doc))
            run = tmp_path / "outputs" / "date" / "time"
            done = real_train([*first.overrides, *few_steps(first.overrides, tiny_data_dir),
                               "trainer.export=true"], first.config_dir, run,
                              config_path=ROOT / "conf")
            assert done.ok, done
            code = code.replace("outputs/<date>/<time>", str(run))
        monkeypatch.setattr(distlab, "train", train)
        real_verify = distlab.verify  # on the tiny data, into tmp_path
        monkeypatch.setattr(distlab, "verify", lambda overrides=(), config_dir=None, **kw: (
            real_verify([*overrides, f"dataset.data_dir={tiny_data_dir}",
                         f"verify.dir={tmp_path / 'verify'}"], config_dir,
                        config_path=ROOT / "conf")))
        namespace: dict = {"__name__": "__snippet__"}
        exec(compile(code, block.where, "exec"), namespace)  # noqa: S102 - the doc's code
    kept = {k: v for k, v in namespace.items() if isinstance(v, distlab.Results)}
    for name, results in kept.items():
        assert results.ok, (block.where, name, results)


def test_the_loop_snippet_pastes_as_a_module():
    """README's loop (the step from Loop's pieces) imports what it uses: tf and distlab."""
    block = next(b for b in BLOCKS if "class ClipPerReplica" in b.text)
    code = next(iter(block.files.values())) if block.kind == "files" else block.text
    assert undefined_names(code) == set()
    assert "self.compute_loss(" in code and "self.apply_gradients(" in code
