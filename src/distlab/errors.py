"""The exception type that reaches the user as a single clear line, and the helpers that
make other errors (a library's, Hydra's composition errors) one line too; `override` writes
an override a message suggests as a shell takes it."""

import json
import re
import shlex
from typing import Any

__all__ = ["DistlabError", "ConfigError"]  # public; the helpers below are distlab's own


class DistlabError(Exception):
    """A problem the user can fix: bad config, missing data, unusable checkpoint.

    A job reports its message on one line (no traceback): `Results.error`, and the
    `distlab` command exits with status 2.
    """


def message(error: BaseException) -> str:
    """An exception's message. An error raised while TensorFlow traced a function lists the
    traced code's frames first ("in user code: ...") and its own message last: that line,
    without its type name."""
    text = str(error).strip()
    if text.startswith("in user code:"):
        last = [line.strip() for line in text.splitlines() if line.strip()][-1]
        return last.removeprefix(f"{type(error).__name__}: ")
    return text


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name if it has none), capped."""
    text = message(error)
    return (text.splitlines()[0] if text else type(error).__name__)[:300]


def described(error: BaseException) -> str:
    """`Type: first line of the message`, for reporting a failure of user or library code."""
    name = type(error).__name__
    return f"{name}: {first_line(error)}" if str(error).strip() else name


class LostWorker(DistlabError):
    """A multi-worker run lost a peer (it died, hung or was stopped): rerun every worker to
    resume. The `distlab` command exits with status 3."""


class ConfigError(DistlabError):
    """A composed config value that is well-typed but impossible (e.g. batch size 0)."""


class UserCodeError(DistlabError):
    """The user's code (a builder, callback or imported module) raised: one line naming the
    key, `raise ... from` the error, whose traceback a job writes to run.log."""


_NOISE = ("full_key:", "reference_type=", "object_type=", "Set the environment variable")


def composition_error(error: BaseException) -> str:
    """A Hydra or OmegaConf composition error (and its cause) as one line naming the key."""
    if isinstance(getattr(error, "override", None), str) and "=" in error.override:
        return _unreadable_override(error.override, first_line(error))
    parts: list[str] = []
    for exc in (error, error.__cause__):
        if exc is None or str(exc) in parts:
            continue
        for line in str(exc).splitlines():
            if line.startswith("Config search path"):
                break
            text = line.strip()
            if not text or text.startswith(_NOISE):
                continue
            if line.startswith("\t") and parts and parts[-1].endswith((":", ",")):
                parts[-1] += f" {text},"  # a list of options, one per line
            else:
                parts.append(text)
    return ". ".join(p.rstrip(",.") for p in parts) or type(error).__name__


_HYDRA_PLAIN = re.compile(r"[\w.+\-/:%@~]+")  # a value Hydra's override grammar reads unquoted
_SHELL_PLAIN = re.compile(r"[\w.+\-/:%@=,]+")  # an argument no POSIX shell changes


def override(key: str, value: Any) -> str:
    """`key=value` as a user types it in a shell: None as null, a value Hydra's grammar would
    misread (`train[:90%]`, a space, a comma) in Hydra's quotes, then the whole argument in
    the shell's: `"dataset.validation='train[90%:]'"`."""
    if isinstance(value, list | dict):  # Hydra reads JSON's lists and dicts
        return shell_quoted(f"{key}={json.dumps(value)}")
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) \
        else str(value)
    return shell_quoted(f"{key}={hydra_value(text)}")


def hydra_value(text: str) -> str:
    """`text` as a value of a Hydra override: as it is where the grammar reads it so, else in
    Hydra's single quotes (a quote inside escaped)."""
    if _HYDRA_PLAIN.fullmatch(text):
        return text
    return "'" + text.replace("'", "\\'") + "'"


def shell_quoted(arg: str) -> str:
    """`arg` quoted for a POSIX shell only where it needs it, in double quotes when they
    suffice (they read better around Hydra's single quotes)."""
    if _SHELL_PLAIN.fullmatch(arg):
        return arg
    if not re.search(r'["$`\\!]', arg):
        return f'"{arg}"'
    return shlex.quote(arg)


def _unreadable_override(text: str, why: str) -> str:
    """An override Hydra's grammar cannot read: named, with the quoting that reads it."""
    key, _, value = text.partition("=")
    if value[:1] in "'\"[{" or not re.search(r"[\[\]{}(),'\" ]", value):
        return f"{text}: Hydra cannot read this override ({why.rstrip('.')})"
    return (f"{text}: Hydra cannot read this override ({why.rstrip('.')}); quote the value "
            f"for Hydra and the whole override for the shell: {override(key, value)}")
