"""The one exception type that reaches the user as a single clear line."""


class DistlabError(Exception):
    """A problem the user can fix: bad config, missing data, unusable checkpoint.

    `run.py` prints its message on one line (no traceback) and exits non-zero.
    """


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name if it has none), capped."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:300]


def described(error: BaseException) -> str:
    """`Type: first line of the message`, for reporting a failure of user or library code."""
    name = type(error).__name__
    return f"{name}: {first_line(error)}" if str(error).strip() else name


class ConfigError(DistlabError):
    """A composed config value that is well-typed but impossible (e.g. batch size 0)."""
