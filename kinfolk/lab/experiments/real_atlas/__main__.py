"""`python -m kinfolk.lab.experiments.real_atlas --pilot [--methods M ...]`: the pilot's runs of those methods (default all);
once every method's pilot runs are kept, the choices go to `docs/results/real-atlas-units/pilot.json`.

`python -m kinfolk.lab.experiments.real_atlas [--seeds S ...]`: the plan's runs, every method of every seed; then the record
of every seed whose runs are all kept. Processes started alike share the runs: each claims the next run no live
process holds (`kinfolk.lab.protocol.claims`), so two one-thread processes use two cores. `python -m kinfolk.lab.protocol analyse real-atlas` reads the records under the plan.
"""

from __future__ import annotations

import argparse
import os
import sys

from kinfolk import console

PILOT_FILE = "docs/results/real-atlas-units/pilot.json"


def main(argv: list[str] | None = None) -> int:
    import torch

    from kinfolk.atomic import write_json
    from kinfolk.lab.experiments.real_atlas.corpus import SPLITS
    from kinfolk.lab.experiments.real_atlas.experiment import RealAtlas
    from kinfolk.lab.experiments.real_atlas.runs import RealAtlasRuns as SeedRuns

    parser = argparse.ArgumentParser(prog="python -m kinfolk.lab.experiments.real_atlas")
    parser.add_argument("--pilot", action="store_true", help="the pilot seed's runs (validation only)")
    parser.add_argument("--methods", nargs="*", help="default: every method of the settings")
    parser.add_argument("--seeds", type=int, nargs="*", help="default: every seed of the settings")
    parser.add_argument("--figure", help="once every seed's record is kept, draw their curves into this PNG")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # two processes on two cores; one thread gives every reduction one order
    settings = RealAtlas().settings
    methods = args.methods or list(settings.methods)
    name = f"{'pilot' if args.pilot else 'runs'}-{os.getpid()}"
    with console.quiet(f"{settings.work}/{name}.log", "real-atlas"):
        if args.pilot:
            from kinfolk.lab.experiments.real_atlas.pilot import choose, pilot_runs

            runs = SeedRuns(settings, splits=("validation",))
            kept = pilot_runs(runs, methods)
            if set(methods) == set(settings.methods) and all(run is not None for run in kept.values()):
                write_json(PILOT_FILE, choose(runs))
                console.show(f"pilot choices: {PILOT_FILE}")
            return 0
        runs = SeedRuns(settings, splits=SPLITS)
        seeds = settings.seeds if args.seeds is None else args.seeds
        for seed in seeds:
            for method in methods:
                runs.method_run(seed, method)
        records = [runs.record(seed) for seed in seeds if all(runs.run_kept(seed, m) for m in settings.methods)]
        console.stage(f"records kept in {settings.records}: {len([r for r in records if r])} of {len(seeds)} seeds")
        if args.figure and len(records) == len(seeds) and all(records):
            from kinfolk.lab.experiments.real_atlas.figure import plot_curves

            console.show(f"curves: {plot_curves(records, args.figure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
