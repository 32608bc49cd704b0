"""The exception type that reaches the user as a single clear line, and the helpers that
make other errors (a library's, Hydra's composition errors) one line too."""


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


_NOISE = ("full_key:", "reference_type=", "object_type=", "Set the environment variable")


def composition_error(error: BaseException) -> str:
    """A Hydra or OmegaConf composition error (and its cause) as one line naming the key."""
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
