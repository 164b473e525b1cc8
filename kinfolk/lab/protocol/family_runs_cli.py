"""The command every family experiment's `__main__` runs: make its plan's records, sharing work between processes.

`main(prog, experiment, family_runs, argv)` parses `--families F ...` and `--runs R ...` (default: the plan's), runs
torch on one thread (two processes on two cores; one thread gives every reduction one order) and calls
`family_runs(settings).record(family, run)` for each pair until every record is kept (`claims.until_made`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def main(prog: str, experiment: Callable[[], Any], family_runs: Callable[[Any], Any], argv: list[str] | None) -> int:
    import torch

    from kinfolk import console
    from kinfolk.lab.protocol.claims import until_made

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--families", type=int, nargs="*", help="default: every family of the plan")
    parser.add_argument("--runs", type=int, nargs="*", help="default: every run of the plan")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = experiment().settings
    families = settings.families if args.families is None else args.families
    runs = range(settings.runs) if args.runs is None else args.runs
    work = family_runs(settings)
    until_made(lambda key: work.record(*key), [(family, run) for family in families for run in runs])
    console.stage(f"records kept in {settings.records}: {len(families) * len(runs)}")
    return 0
