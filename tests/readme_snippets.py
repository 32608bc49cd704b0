"""The code blocks of README.md, the documentation site's pages (docs/**/*.md) and
examples/*/README.md, read as a user reads them.

markdown-it-py (CommonMark, installed with Keras' `rich`) finds the blocks. A block is
- files: it starts with `# path/to/file.py` (or .yaml), and may hold several such files;
- shell: commands (`python run.py ...`, `distlab ...`, `pip ...`), read as a POSIX shell
  reads them (continuation lines, comments, quotes, `&&`, an environment prefix), so a
  command's argv is exactly what its program gets;
- python: code a user pastes (it parses, and is not YAML);
- other: output, YAML without a file name, layouts.
`Command` turns a `distlab` / `python .../run.py` command into what `distlab.train` takes.
"""

from __future__ import annotations

import ast
import builtins
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# records, not instructions: the commands and code excerpts as they were when measured (the
# benchmarks' own scripts, code since changed), and standalone reproductions (tests/repro/)
RECORDS = {ROOT / "docs" / "BENCHMARKS.md", ROOT / "docs" / "keras-distribute-bugs.md"}
# README.md and the site's pages: one user project (`# my_project/...` files) runs them all
PROJECT_DOCS = (ROOT / "README.md",
                *sorted(p for p in (ROOT / "docs").rglob("*.md") if p not in RECORDS))
DOCS = (*PROJECT_DOCS, *sorted((ROOT / "examples").glob("*/README.md")))
FILE_HEADER = re.compile(r"^# ([\w./-]+\.(?:py|yaml|toml))\s*$")
SHELL_PROGRAMS = ("python", "distlab", "pip", "export", "cd", "srun", "mlflow",
                  "saved_model_cli", "tensorboard")
PLACEHOLDER = re.compile(r"<[a-z ]+>")  # <run dir>, outputs/<date>/<time>
PLACEHOLDER_WORD = re.compile(r"<[a-z_]+>")
# names a fragment (a Python block without imports, a piece of a file shown above it) uses
FRAGMENT_PREAMBLE = ("import keras\nimport numpy as np\nimport tensorflow as tf\n"
                     "import distlab\nfrom distlab import Metric, Task\n")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # the 1-based line of its first line in doc
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def files(self) -> dict[str, str]:
        """{path: text} of a block of files, each starting at its `# path` line."""
        out: dict[str, list[str]] = {}
        current = None
        for line in self.text.splitlines():
            if match := FILE_HEADER.match(line):
                current = match.group(1)
                out[current] = []
            elif current is not None:
                out[current].append(line)
        return {path: "\n".join(lines).strip() + "\n" for path, lines in out.items()}

    @property
    def kind(self) -> str:
        if FILE_HEADER.match(self.text.splitlines()[0]):
            return "files"
        words = shell_words(first_code_line(joined(self.text)))
        while words and re.match(r"^[A-Z_]+=", words[0]):  # an environment prefix
            words = words[1:]
        if words and words[0] in SHELL_PROGRAMS:
            return "shell"
        try:
            tree = ast.parse(self.text)
        except SyntaxError:
            return "other"
        if any(isinstance(node, ast.AnnAssign) for node in tree.body):  # `key: value`
            return "other"
        return "python"

    @property
    def is_fragment(self) -> bool:
        """Python without an import of its own: a piece of a file the text shows."""
        return not any(isinstance(n, ast.Import | ast.ImportFrom)
                       for n in ast.walk(ast.parse(self.text)))


def blocks(doc: Path) -> list[Block]:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(doc.read_text())
    return [Block(doc, t.map[0] + 1, t.content) for t in tokens
            if t.type in ("code_block", "fence") and t.content.strip()]


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc)]


def block_with(text: str) -> Block:
    """The block of README.md or a site page that contains `text` (a test of its code)."""
    return next(b for doc in PROJECT_DOCS for b in blocks(doc) if text in b.text)


def docs_text() -> str:
    """README.md and the site's pages, as one text (a test of what they say)."""
    return "\n".join(doc.read_text() for doc in PROJECT_DOCS)


def joined(text: str) -> str:
    """Continuation lines (a trailing backslash) joined, as the shell joins them."""
    return re.sub(r"\\\n\s*", " ", text)


def first_code_line(text: str) -> str:
    return next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip()
                 .startswith("#")), "")


def shell_words(line: str) -> list[str]:
    """`line`'s words after the shell's quote removal; a placeholder (`<run dir>`) is one
    word, as the text means it (a shell would read `<` as a redirection)."""
    try:
        return [PLACEHOLDER_WORD.sub(lambda m: m.group(0).replace("_", " "), word)
                for word in shlex.split(PLACEHOLDER.sub(
                    lambda m: m.group(0).replace(" ", "_"), line), comments=True)]
    except ValueError:
        return []


def undefined_names(code: str) -> set[str]:
    """Names the code reads that nothing in it defines (nor Python's builtins): a pasted
    block that lacks an import. Scopes are not told apart (good enough for a snippet)."""
    tree = ast.parse(code)
    defined, used = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    return used - defined


# ------------------------------------------------------------------------- shell commands

@dataclass
class Command:
    """One command of a shell block: its program, argv (after the shell), environment
    prefix, and, for distlab, what `distlab.train` takes."""

    block: Block
    text: str  # as written (continuations joined, comment dropped)
    env: dict[str, str]
    argv: list[str]
    config_dir: str | None = None
    multirun: bool = False
    flags: list[str] = field(default_factory=list)  # --cfg job, --help, --info ...
    overrides: list[str] = field(default_factory=list)
    verify: bool = False  # `distlab verify OVERRIDES` (its verify.* settings left out)

    @property
    def program(self) -> str:
        return self.argv[0] if self.argv else ""

    @property
    def is_distlab(self) -> bool:
        return self.program == "distlab" or (
            self.program == "python" and len(self.argv) > 1 and self.argv[1].endswith("run.py"))

    @property
    def sweeps(self) -> bool:
        return self.multirun or any(o.startswith("hparams_search=") for o in self.overrides)

    @property
    def trains(self) -> bool:
        """A single training or evaluation run (not a sweep, not --cfg/--help/--info)."""
        return self.is_distlab and not self.sweeps and not self.flags and not self.verify

    @property
    def id(self) -> str:
        return f"{self.block.where}:{self.text[:70]}"


def commands(block: Block) -> list[Command]:
    """The block's commands: lines joined at a trailing backslash, `&&` chains split."""
    out = []
    for line in joined(block.text).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = shell_words(line)
        written = line.split(" #")[0].strip()
        chain: list[list[str]] = [[]]
        for word in words:
            if word == "&&":
                chain.append([])
            else:
                chain[-1].append(word)
        for argv in chain:
            env = {}
            while argv and re.match(r"^[A-Z_]+=", argv[0]):
                key, _, value = argv.pop(0).partition("=")
                env[key] = value
            if argv and argv[0] == "srun":  # the command it starts on every task
                argv.pop(0)
                env["SRUN"] = ""
                while argv and argv[0].startswith("-"):
                    env["SRUN"] += f" {argv.pop(0)}"
            out.append(_parsed(Command(block, written, env, argv)))
    return out


def _parsed(command: Command) -> Command:
    if not command.is_distlab:
        return command
    args = command.argv[1 if command.program == "distlab" else 2:]
    if args[:1] == ["verify"]:  # the run's overrides are checked; verify's own settings not
        command.verify = True
        args = [a for a in args[1:] if not a.startswith("verify.")]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--config-dir", "-cd"):
            command.config_dir, i = args[i + 1], i + 2
            continue
        if arg.startswith("--config-dir="):
            command.config_dir = arg.partition("=")[2]
        elif arg in ("-m", "--multirun"):
            command.multirun = True
        elif arg in ("--cfg", "-c", "--info", "-i", "--package", "-p"):
            command.flags.append(arg)
            if i + 1 < len(args) and "=" not in args[i + 1]:
                command.flags.append(args[i + 1])
                i += 1
        elif arg.startswith("-"):
            command.flags.append(arg)
        else:
            command.overrides.append(arg)
        i += 1
    return command


def unquoted_glob(text: str) -> list[str]:
    """The words of a command line that a shell would glob ([, *, ? outside quotes): bash
    leaves an unmatched one as it is, zsh stops with "no matches found"."""
    bad, word, quote, globbed = [], "", None, False
    for char in text.split(" #")[0] + " ":
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char.isspace():
            if globbed:
                bad.append(word)
            word, globbed = "", False
            continue
        elif char in "[]*?":
            globbed = True
        word += char
    return bad


# -------------------------------------------------------------------------- isolation

@contextmanager
def user_code_sandbox(*roots: Path) -> Iterator[None]:
    """Registrations, imported user modules (files under `roots`) and sys.path entries made
    inside are undone afterwards, so snippets that register the same names (the README's
    and tests/user_loops.py's `clip_per_replica`) run in one process."""
    from distlab.registry import REGISTRIES

    saved = {g: (dict(r._items), dict(r._origin), dict(r.schemas))
             for g, r in REGISTRIES.items()}
    path, modules = list(sys.path), set(sys.modules)
    try:
        yield
    finally:
        for group, (items, origin, schemas) in saved.items():
            registry = REGISTRIES[group]
            registry._items, registry._origin, registry.schemas = items, origin, schemas
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if any(str(file).startswith(str(root)) for root in roots):
                del sys.modules[name]
