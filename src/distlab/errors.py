"""The one exception type that reaches the user as a single clear line."""


class DistlabError(Exception):
    """A problem the user can fix: bad config, missing data, unusable checkpoint.

    `run.py` prints its message on one line (no traceback) and exits non-zero.
    """


class ConfigError(DistlabError):
    """A composed config value that is well-typed but impossible (e.g. batch size 0)."""
