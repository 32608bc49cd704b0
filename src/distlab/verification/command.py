"""`distlab verify [--config-dir DIR] OVERRIDES`: verify the run those arguments make, print
one table row per check, write verify.json, exit 0 only when every check holds (1: a check
failed; 2: the command or the config was refused)."""

from __future__ import annotations

import sys
from pathlib import Path

USAGE = ("usage: distlab verify [--config-dir DIR] [OVERRIDES...] [verify.checks=[data,...]] "
         "[verify.workers=true] [verify.steps=N] [verify.batch=N] [verify.rows=N] "
         "[verify.dir=PATH]")


def main(args: list[str], config_path: str | None = None) -> int:
    """Run the command on `args` (after `verify`); its exit status."""
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        print("Checks the invariants of the run the overrides make, on a brief version of it "
              "(see the guide 'Verify an experiment'); exit 0 when every check holds.")
        return 0
    config_dir, overrides = None, []
    rest = iter(args)
    for arg in rest:
        if arg in ("--config-dir", "-cd"):
            config_dir = next(rest, None)
            if config_dir is None:
                print(f"error: {arg} needs a directory\n{USAGE}", file=sys.stderr)
                return 2
        elif arg.startswith("--config-dir="):
            config_dir = arg.partition("=")[2]
        elif arg.startswith("-"):
            print(f"error: distlab verify does not take {arg}\n{USAGE}", file=sys.stderr)
            return 2
        else:
            overrides.append(arg)
    from distlab.verification import verify

    started: list[Path] = []

    def start(scratch: Path) -> None:
        started.append(scratch)
        print("distlab verify: a brief version of the run, checked (this takes a minute or "
              f"two; its runs go to {scratch})", flush=True)

    try:
        report = verify(overrides, config_dir=Path(config_dir) if config_dir else None,
                        config_path=config_path, on_start=start,
                        on_row=lambda row: print(f"  {row.check}: {row.status} "
                                                 f"({row.seconds:.1f} s)", flush=True))
    except KeyboardInterrupt:
        where = f" (its runs so far: {started[0]})" if started else ""
        print(f"verify interrupted: no verdict, no verify.json{where}", file=sys.stderr,
              flush=True)
        return 130
    if report.error:
        print(f"error: {report.error}", file=sys.stderr)
        return report.exit_code
    print(report.table(), flush=True)
    return report.exit_code
