"""What `distlab verify` found: one `Row` per check, the `Report` that holds them, its table
on the terminal and its `verify.json`. No TensorFlow here."""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASSED, WARNING, FAILED, SKIPPED = "passed", "warning", "failed", "skipped"


@dataclass
class Row:
    """One check's verdict. `summary`: what was compared (one line); on a warning or a
    failure, `differs` (what differs, by how much) and `cause` (the most likely cause in the
    user's code); `figures`: the measured numbers; `seconds`: what the check took."""

    check: str
    status: str
    summary: str
    differs: str | None = None
    cause: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def holds(self) -> bool:
        return self.status in (PASSED, WARNING, SKIPPED)


@dataclass
class Report:
    """`distlab verify`'s rows, the scratch directory its runs wrote to (`verify.json` is
    there), and the overrides it verified. `ok`: every row holds (warnings allowed)."""

    rows: list[Row]
    scratch_dir: Path | None  # None: refused before one was made
    overrides: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None  # the experiment could not be composed or validated
    json_path: Path | None = None  # verify.json once written (None: nothing was written)

    @property
    def ok(self) -> bool:
        return self.error is None and all(row.holds for row in self.rows)

    @property
    def exit_code(self) -> int:
        """The `distlab verify` command's status: 0 every row holds, 1 a row failed, 2 the
        command or its config was refused."""
        return 2 if self.error else 0 if self.ok else 1

    def __getitem__(self, check: str) -> Row:
        for row in self.rows:
            if row.check == check:
                return row
        raise KeyError(f"no {check!r} row: the checks run were "
                       f"{', '.join(r.check for r in self.rows) or 'none'}")

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "overrides": self.overrides,
                "scratch_dir": None if self.scratch_dir is None else str(self.scratch_dir),
                "seconds": round(self.seconds, 1), "error": self.error,
                "rows": [asdict(row) for row in self.rows]}

    def write(self) -> Path:
        """verify.json in the scratch directory (strict JSON: a non-finite number is null)."""
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        path = self.scratch_dir / "verify.json"
        path.write_text(json.dumps(_finite(self.to_dict()), indent=2, default=str,
                                   allow_nan=False) + "\n")
        self.json_path = path
        return path

    def table(self, width: int | None = None) -> str:
        """One line per check (status, check, what it compared), then the indented detail
        of each warning or failure."""
        width = width or min(shutil.get_terminal_size((110, 20)).columns, 140)
        name = max([5, *(len(r.check) for r in self.rows)])
        lines = [f"{'check':<{name}}  {'status':<8} {'time':>6}  what was compared"]
        for row in self.rows:
            head = f"{row.check:<{name}}  {row.status:<8} {row.seconds:5.1f}s  "
            lines.append(head + _cut(row.summary, width - len(head)))
            for label, text in (("differs", row.differs), ("cause", row.cause)):
                if text and row.status in (FAILED, WARNING):
                    lines += textwrap.wrap(f"{label}: {text}", width,
                                           initial_indent=" " * (name + 2),
                                           subsequent_indent=" " * (name + 4))
        verdict = ("every check holds" if self.ok else
                   f"{sum(not r.holds for r in self.rows)} check(s) failed")
        lines.append(f"{verdict} ({self.seconds:.0f} s); details: {self.json_path}")
        return "\n".join(lines)


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room or room < 20 else text[: room - 1] + "…"


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinite float (numpy's too) as None, recursively."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    import numpy as np  # here: importing distlab (this module) imports no NumPy

    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
