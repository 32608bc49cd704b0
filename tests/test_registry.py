"""Registries, import paths, `imports:`, entry points and user schemas (no training)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import pytest
from conftest import ROOT, compose, refusal_in_process, run_command

from distlab import plugins
from distlab.errors import DistlabError, UserCodeError
from distlab.registry import MODELS, Registry, RegistryError, is_import_path, register


def test_register_and_get():
    reg = Registry("widget", ("cfg",))

    @reg.register("a")
    def build_a(cfg):
        return "A"

    assert reg.get("a")(None) == "A" and "a" in reg and reg.names() == ["a"]


def test_a_users_builder_that_raises_is_one_line_naming_the_key_with_its_cause_kept():
    reg = Registry("widget", ("cfg",), {"own": "distlab.components.models:cnn"})

    @reg.register("mine")
    def build_mine(cfg):
        raise ValueError("units must be positive, got -3\nsecond line")

    with pytest.raises(UserCodeError) as raised:
        reg.build("mine", None)
    assert str(raised.value) == ("widget.name='mine' failed: ValueError: units must be "
                                 "positive, got -3")
    assert isinstance(raised.value.__cause__, ValueError)  # its traceback, for run.log
    with pytest.raises(TypeError):  # distlab's own builder's error is distlab's, not wrapped
        reg.build("own", None)

    @reg.register("exits")
    def build_exits(cfg):
        raise SystemExit(1)  # it ended a whole sweep

    with pytest.raises(UserCodeError, match=r"^widget.name='exits' called sys.exit\(1\)$"):
        reg.build("exits", None)


def test_duplicate_name_is_an_error_naming_the_first():
    reg = Registry("widget", ("cfg",), {"a": "distlab.components.models:cnn"})
    with pytest.raises(RegistryError, match="widget 'a' is already registered \\(by distlab\\)"):
        reg.register("a")(lambda cfg: 2)


def test_unknown_name_lists_known_names():
    reg = Registry("widget", ("cfg",))
    reg.register("beta")(lambda cfg: 1)
    reg.register("alpha")(lambda cfg: 2)
    with pytest.raises(RegistryError, match=r"unknown widget\.name='gamma'.*alpha, beta"):
        reg.get("gamma")


def test_import_paths():
    assert is_import_path("my_pkg.models:net") and is_import_path("m:f")
    assert not is_import_path("mnist") and not is_import_path("mnist:3.0.1")
    assert MODELS.get("distlab.components.models:cnn").__name__ == "cnn"
    with pytest.raises(RegistryError, match=r"model\.name='no_such_pkg\.x:f' does not import: "
                                            r"ModuleNotFoundError"):
        MODELS.get("no_such_pkg.x:f")
    with pytest.raises(RegistryError, match=r"model\.name='distlab\.components\.models:nope': "
                                            r"module 'distlab\.components\.models' has no "
                                            r"attribute 'nope' \(it imports"):
        MODELS.get("distlab.components.models:nope")
    with pytest.raises(RegistryError, match=r"model\.name='distlab\.registry:BUILTIN_TASKS' "
                                            r"is a tuple, not a callable"):
        MODELS.get("distlab.registry:BUILTIN_TASKS")


def test_wrong_signature_is_refused_naming_the_call():
    # os.path.exists(path) cannot be called as f(cfg, input_shape, outputs)
    with pytest.raises(RegistryError, match=r"model\.name='os\.path:exists' has the wrong "
                                            r"signature.*called as f\(cfg, input_shape, outputs\)"):
        MODELS.get("os.path:exists")


def test_register_public_api_checks_group_and_signature():
    with pytest.raises(RegistryError, match="no such group"):
        register("widget", "x", lambda cfg: 1)
    with pytest.raises(RegistryError, match="wrong signature"):
        register("optimizer", "too_few", lambda cfg: 1)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user package on sys.path (as when running from the project's directory)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def write(module: str, source: str) -> str:
        path = tmp_path / f"{module}.py"
        path.write_text(textwrap.dedent(source))
        created.append(module)
        return module

    write.root = tmp_path
    yield write
    for module in created:
        sys.modules.pop(module, None)
    for reg_name in ("schema_net", "plain_net"):
        MODELS._items.pop(reg_name, None)
        MODELS.schemas.pop(reg_name, None)


def test_imports_register_names_and_schemas(project):
    project("user_models", """
        from dataclasses import dataclass
        import distlab

        @dataclass
        class NetConfig:
            width: int = 8

        @distlab.register("model", "schema_net", schema=NetConfig)
        def net(cfg, input_shape, outputs):
            return "built"
    """)
    conf = project.root / "conf" / "model"
    conf.mkdir(parents=True)

    def with_yaml(text: str):
        (conf / "net.yaml").write_text(textwrap.dedent(text))
        return compose([f"hydra.searchpath=[file://{project.root / 'conf'}]", "model=net",
                        "imports=[user_models]"])

    cfg = with_yaml("name: schema_net\nwidth: 16\n")
    plugins.check(cfg)
    assert cfg.model == {"width": 16, "name": "schema_net"}
    defaults = with_yaml("name: schema_net\n")
    plugins.check(defaults)
    assert defaults.model.width == 8  # the schema's default
    with pytest.raises(DistlabError, match=r"model\.depth is not a key of model 'schema_net' "
                                           r"\(its schema NetConfig declares: name, width\)"):
        plugins.check(with_yaml("name: schema_net\ndepth: 3\n"))
    with pytest.raises(DistlabError, match=r"model\.width is invalid for model 'schema_net' "
                                           r"\(NetConfig\): Value 'wide'"):
        plugins.check(with_yaml("name: schema_net\nwidth: wide\n"))


@pytest.mark.parametrize("source, match", [
    ("raise ValueError('boom')", r"imports\[0\]='user_bad' raised ValueError: boom"),
    ("import no_such_dependency", r"imports\[0\]='user_bad' raised ModuleNotFoundError"),
    ("import sys\nsys.exit(3)", r"imports\[0\]='user_bad' raised SystemExit: 3"),  # (a sweep)
    ("import distlab\ndistlab.register('model', 'cnn', lambda c, s, o: 1)",
     r"imports\[0\]='user_bad': model 'cnn' is already registered \(by distlab\)"),
    ("import distlab\ndistlab.register('model', 'plain_net', lambda c: 1)",
     r"imports\[0\]='user_bad'.*wrong signature.*f\(cfg, input_shape, outputs\)"),
])
def test_imports_errors_are_one_line(project, source, match):
    project("user_bad", source)
    with pytest.raises(DistlabError, match=match) as info:
        plugins.import_modules(["user_bad"])
    assert "\n" not in str(info.value)


def test_missing_imports_module_says_what_to_do(project):
    with pytest.raises(DistlabError, match=r"imports\[0\]='not_there' does not import.*run "
                                           r"from the directory"):
        plugins.import_modules(["not_there"])


@pytest.mark.parametrize("entry, message", [
    ("distlab.registry.nope", "imports[0]='distlab.registry.nope' does not import: module "
                              "'distlab.registry' has no submodule 'nope' (it is a module, not "
                              "a package)"),
    ("distlab.registry.register", "imports[0]='distlab.registry.register': 'register' is an "
                                  "attribute of module 'distlab.registry', not a module; list "
                                  "the module ('distlab.registry')"),
    ("distlab.registry:register", "imports[0]='distlab.registry:register' is an import path; "
                                  "imports: lists modules to import, e.g. 'distlab.registry'"),
])
def test_an_imports_entry_that_is_not_a_module_says_what_it_is(entry, message):
    with pytest.raises(DistlabError) as info:
        plugins.import_modules([entry])
    assert str(info.value) == message


def test_group_names_are_checked_before_anything_is_built():
    with pytest.raises(RegistryError, match=r"unknown optimizer\.name='adamw'"):
        plugins.check(compose(["optimizer.name=adamw"]))
    with pytest.raises(RegistryError, match=r"loop\.name='nope\.mod:Loop' does not import"):
        plugins.check(compose(["loop.name=nope.mod:Loop"]))
    plugins.check(compose(["dataset.name=some_tfds_name"]))  # tfds names are checked at load


@dataclass
class _EntryPoint:
    name: str
    value: str
    target: object

    def load(self):
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def test_entry_points_load_once_and_fail_in_one_line(monkeypatch):
    calls = []
    monkeypatch.setattr(plugins, "_loaded_plugins", False)
    monkeypatch.setattr(plugins, "entry_points",
                        lambda group: [_EntryPoint("mine", "pkg:setup", lambda: calls.append(1))])
    plugins.load_plugins()
    plugins.load_plugins()
    assert calls == [1]
    monkeypatch.setattr(plugins, "_loaded_plugins", False)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [
        _EntryPoint("broken", "pkg.broken", ImportError("no module named pkg"))])
    with pytest.raises(DistlabError, match=r"plug-in entry point broken = pkg\.broken failed: "
                                           r"ImportError: no module named pkg; fix or uninstall"):
        plugins.load_plugins()


@pytest.mark.slow
def test_cli_plugin_errors_are_one_line_before_tensorflow(tmp_path, monkeypatch):
    """The four plug-in errors: one line each, exit 2, before TensorFlow is imported; one
    through `python run.py` in a fresh interpreter (its exit status and output; the
    command's time is printed, a smoke figure, not asserted: it depends on the machine and
    its load), the others as that command's job runs them, in this process (distlab's
    TensorFlow side not imported: conftest.refusal_in_process)."""
    (tmp_path / "user_raises.py").write_text("raise RuntimeError('broken module')\n")
    (tmp_path / "user_twice.py").write_text(
        "import distlab\ndistlab.register('model', 'cnn', lambda c, s, o: 1)\n")
    override, expected = "imports=[user_raises]", ("imports[0]='user_raises' raised "
                                                   "RuntimeError: broken module")
    start = time.time()
    out, tensorflow = run_command(override, f"hydra.run.dir={tmp_path / 'out'}", cwd=tmp_path)
    print(f"{override}: refused in {time.time() - start:.1f} s")
    assert not tensorflow, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() + out.stdout.splitlines()
              if "ERROR" in line or line.startswith("error")]
    assert out.returncode == 2 and len(errors) == 1 and expected in errors[0], (
        override, out.stdout[-2000:], out.stderr[-2000:])
    assert "Traceback" not in out.stderr + out.stdout

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "model.name=user_nothere:net": "model.name='user_nothere:net' does not import",
        "model.name=os.path:exists": "wrong signature",
        "imports=[user_twice]": "model 'cnn' is already registered",
        "imports=[user_raises]": expected,  # (as the command's)
    }
    for num, (override, expected) in enumerate(cases.items()):
        error = refusal_in_process(tmp_path / f"job{num}", override)  # one line, exit 2
        assert expected in error and "Traceback" not in error, (override, error)
    for name in ("user_raises", "user_twice"):
        sys.modules.pop(name, None)


def test_cpu_devices_error_names_what_started_tensorflow(monkeypatch):
    """This session's runtime has 3 CPUs, so 4 cannot be applied: the message names the
    module that started TensorFlow at import, else an earlier job (then the sweep advice),
    else neither."""
    import tensorflow as tf
    from omegaconf import OmegaConf

    from distlab.components import strategies

    assert len(tf.config.list_logical_devices("CPU")) == 3  # (this starts the runtime)
    cfg = OmegaConf.create({"cpu_devices": 4})
    monkeypatch.setattr(plugins, "_tf_started_by", "'my_parts' (imports[0])")
    monkeypatch.setattr(strategies, "_jobs_configured", 1)
    with pytest.raises(DistlabError) as module:
        strategies.configure_devices(cfg)
    monkeypatch.setattr(plugins, "_tf_started_by", None)
    monkeypatch.setattr(strategies, "_jobs_configured", 1)
    with pytest.raises(DistlabError) as earlier:
        strategies.configure_devices(cfg)
    monkeypatch.setattr(strategies, "_jobs_configured", 0)
    with pytest.raises(DistlabError) as unknown:
        strategies.configure_devices(cfg)
    assert "module 'my_parts' (imports[0]) was imported" in str(module.value)
    assert "inside functions" in str(module.value) and "launcher" not in str(module.value)
    assert "earlier job" in str(earlier.value) and "hydra/launcher=" in str(earlier.value)
    assert "launcher" not in str(unknown.value) and "earlier job" not in str(unknown.value)
    for error in (module, earlier, unknown):
        assert "cpu_devices=4 cannot be applied" in str(error.value)
        assert "3 CPU device(s)" in str(error.value)


@pytest.mark.slow
def test_cli_cpu_devices_names_the_module_that_started_tensorflow(tmp_path):
    (tmp_path / "user_tf_state.py").write_text("import keras\n\nAUC = keras.metrics.AUC()\n")
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "imports=[user_tf_state]",
                          "strategy.cpu_devices=2", f"hydra.run.dir={tmp_path / 'out'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    errors = [line for line in out.stderr.splitlines() + out.stdout.splitlines()
              if "[ERROR]" in line or line.startswith("error")]  # not TF's C++ log
    assert out.returncode == 2 and len(errors) == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert ("cpu_devices=2 cannot be applied: TensorFlow already runs in this process with 1 "
            "CPU device(s), started when module 'user_tf_state' (imports[0]) was imported"
            in errors[0]), errors[0]
    assert "inside functions" in errors[0] and "sweep" not in errors[0].lower(), errors[0]
    assert "Traceback" not in out.stderr + out.stdout


def _configs_entry_point(monkeypatch, value: str) -> None:
    """Installed packages' `distlab.configs` entry points: just this one."""
    from importlib.metadata import EntryPoint

    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra's plugin scan (re-)executes the module: patch it afterwards
    import hydra_plugins.distlab_searchpath as searchpath

    monkeypatch.setattr(searchpath, "entry_points", lambda group: [
        EntryPoint("demo", value, group)] if group == "distlab.configs" else [])


def test_configs_entry_point_puts_a_package_on_the_search_path(tmp_path, monkeypatch):
    conf = tmp_path / "demo_configs_pkg" / "conf"
    (conf / "model").mkdir(parents=True)
    (conf.parent / "__init__.py").write_text("")
    (conf / "__init__.py").write_text("")
    (conf / "model" / "demo_mlp.yaml").write_text(
        "defaults:\n  - /schema_model_mlp@_here_\n  - _self_\nname: mlp\nhidden_units: [7]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _configs_entry_point(monkeypatch, "demo_configs_pkg.conf")
    cfg = compose(["model=demo_mlp"])  # found with no config dir of its own
    assert cfg.model.name == "mlp" and list(cfg.model.hidden_units) == [7]

    _configs_entry_point(monkeypatch, "no_such_configs_pkg.conf")
    with pytest.raises(Exception, match=r"^distlab.configs entry point demo = "
                                        r"no_such_configs_pkg.conf: no such package"):
        compose([])


def test_config_dir_that_is_no_directory_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "--config-dir", "conf",
                          "experiment=mine"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.strip() == (
        f"error: --config-dir conf: no directory {tmp_path / 'conf'} (a relative --config-dir "
        f"is taken from the current directory, {tmp_path}: run from the directory that holds "
        "it or give its absolute path); configs shipped in an installed package (a "
        "distlab.configs entry point) need none"), out.stderr
    absolute = subprocess.run([sys.executable, str(ROOT / "run.py"), "--config-dir",
                               str(tmp_path / "nope")], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
    assert absolute.returncode == 2 and absolute.stderr.strip().startswith(
        f"error: --config-dir {tmp_path / 'nope'}: no directory {tmp_path / 'nope'} (check "
        "the path);"), absolute.stderr
