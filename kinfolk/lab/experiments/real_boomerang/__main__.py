"""`python -m kinfolk.lab.experiments.real_boomerang [--seeds 0 2 4] [--figure PATH]`: make the seeds' records (distil and measure)
in this process; with `--figure`, then draw every kept seed's curves there (`figure.plot_curves`).

Two such processes on disjoint seeds use two cores; `python -m kinfolk.lab.protocol analyse real-boomerang` then
reads the kept records under the committed plan (and makes any still missing).
"""

from __future__ import annotations

import argparse
import sys

from kinfolk import console


def main(argv: list[str] | None = None) -> int:
    from kinfolk.lab.experiments.real_boomerang.experiment import RealBoomerang
    from kinfolk.lab.experiments.real_boomerang.runs import RealBoomerangRuns as SeedRuns

    parser = argparse.ArgumentParser(prog="python -m kinfolk.lab.experiments.real_boomerang")
    parser.add_argument("--seeds", type=int, nargs="*", help="default: every seed of the plan's settings")
    parser.add_argument("--figure", help="draw the seeds' curves into this PNG once their records are kept")
    args = parser.parse_args(argv)
    settings = RealBoomerang().settings
    seeds = settings.seeds if args.seeds is None else args.seeds
    with console.quiet(f"{settings.work}/run-{'-'.join(map(str, seeds))}.log", "real-boomerang"):
        runs = SeedRuns(settings)
        for seed in seeds:
            runs.record(seed)
            console.stage(f"seed {seed}: record kept in {settings.records}/{seed}.json")
        if args.figure:
            from kinfolk.lab.experiments.real_boomerang.figure import plot_curves

            console.show(f"curves: {plot_curves([runs.record(seed) for seed in seeds], args.figure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
