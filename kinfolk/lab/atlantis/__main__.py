"""`python -m kinfolk.lab.atlantis [--families F ...] [--runs R ...]`: the atlantis-controls plan's runs.

Builds each family's strong and weak large bases (cached in the lab cache), scores the pools and trains every arm,
keeping each result under `runs/atlantis-controls/`; a run's record goes to `docs/results/atlantis-controls-families/`
once whole. Processes started alike share the work (each claims what no live process holds), so two one-thread
processes use both cores; a stopped one resumes. `python -m kinfolk.lab.protocol analyse atlantis-controls` then
reads the records under the committed plan.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    import torch

    from kinfolk import console
    from kinfolk.lab.atlantis.controls import AtlantisControls
    from kinfolk.lab.atlantis.runs import FamilyRuns

    parser = argparse.ArgumentParser(prog="python -m kinfolk.lab.atlantis")
    parser.add_argument("--families", type=int, nargs="*", help="default: every family of the plan")
    parser.add_argument("--runs", type=int, nargs="*", help="default: every run of the plan")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # two processes on two cores; one thread gives every reduction one order
    settings = AtlantisControls().settings
    families = settings.families if args.families is None else args.families
    runs = range(settings.runs) if args.runs is None else args.runs
    work = FamilyRuns(settings)
    pending = [(family, run) for family in families for run in runs]
    while pending:  # each pass makes what no other process holds; what another holds is retried after it
        pending = [(family, run) for family, run in pending if work.record(family, run) is None]
        if pending:
            console.stage(f"{len(pending)} runs wait on another process's work")
            time.sleep(20)
    console.stage(f"records kept in {settings.records}: {len(families) * len(runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
