"""How long each `kinfolk <verb> --help` takes in a fresh process, beside `trl sft --help`.

Each command runs in its own subprocess (`<venv>/bin/kinfolk VERB --help`, `<venv>/bin/trl sft --help`, output
discarded), the commands taking turns round after round (`--repeats` rounds after a warm-up, bench/timing.py). Two
clocks per run: wall time (what the user waits for) and the child process's CPU time (user + system, from
`getrusage(RUSAGE_CHILDREN)`: what a neighbour on another core does not inflate).

Goals:

- `<verb>_help_seconds <= 3` for the verbs whose options are kinfolk's own (score, merge, route, churn, drift,
  lab, demo, env): the median wall time of the rounds, its spread their interquartile range;
- `<verb>_over_trl_sft <= 1.1` for the verbs that wrap TRL's or lm-eval's parsers (sft, distil, eval): their CPU
  time over that of `trl sft --help` in the same round, the median of the per-round ratios with their
  interquartile range as its spread ("no slower", within the tenth by which one fresh interpreter's start varies).

Ends with one JSON line.

    OMP_NUM_THREADS=1 python bench/bench_cli_help.py [--repeats 5] [--verbs score merge ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from timing import Spread, interleaved, paired_ratio, quartiles, report

OWN_VERBS = ("score", "merge", "route", "churn", "drift", "lab", "demo", "env")
WRAPPING_VERBS = ("sft", "distil", "eval")
REFERENCE = "trl sft"
HELP_SECONDS_GOAL = "<= 3"
OVER_TRL_GOAL = "<= 1.1"


def children_cpu_seconds() -> float:
    """User + system CPU seconds of every finished child process of this one (the clock `interleaved` reads)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def command_line(name: str) -> list[str]:
    """The console script beside this interpreter: `kinfolk VERB --help` or `trl sft --help`."""
    program, verb = name.split()
    return [str(Path(sys.executable).with_name(program)), verb, "--help"]


def timed_run(argv: list[str], wall: list[float]):
    """A run for `interleaved`: the command in a fresh process, its wall seconds appended to `wall`."""

    def run() -> None:
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall.append(time.perf_counter() - start)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, after one warm-up round")
    parser.add_argument("--verbs", nargs="+", default=[*OWN_VERBS, *WRAPPING_VERBS], help="kinfolk verbs to time")
    args = parser.parse_args()
    names = [f"kinfolk {verb}" for verb in args.verbs]
    wrapping = [verb for verb in args.verbs if verb in WRAPPING_VERBS]
    if wrapping:
        names.append(REFERENCE)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu = interleaved(
        {name: timed_run(command_line(name), wall[name]) for name in names}, args.repeats, clock=children_cpu_seconds
    )
    wall = {name: seconds[-args.repeats :] for name, seconds in wall.items()}  # the warm-up round is not timed

    spreads: dict[str, Spread] = {}
    goals: dict[str, str] = {}
    for verb in args.verbs:
        if verb in OWN_VERBS:
            low, median, high = quartiles(wall[f"kinfolk {verb}"])
            spreads[f"{verb}_help_seconds"] = Spread(median, low, high, args.repeats)
            goals[f"{verb}_help_seconds"] = HELP_SECONDS_GOAL
        else:
            spreads[f"{verb}_over_trl_sft"] = paired_ratio(cpu[f"kinfolk {verb}"], cpu[REFERENCE])
            goals[f"{verb}_over_trl_sft"] = OVER_TRL_GOAL
    figures = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
        "wall_seconds": {name: round(statistics.median(seconds), 3) for name, seconds in wall.items()},
        "cpu_seconds": {name: round(statistics.median(seconds), 3) for name, seconds in cpu.items()},
        "rounds": args.repeats,
    }
    print(json.dumps(report("cli_help", figures, spreads, goals)))


if __name__ == "__main__":
    main()
