"""`python -m kinfolk.lab.protocol plan|analyse EXPERIMENT [--results docs/results] [--work runs/protocol]`.

`plan` writes the experiment's plan file (never over a different one); `analyse` runs the experiment under the
committed plan and writes `<results>/<experiment>.json`.
"""

from __future__ import annotations

import argparse
import sys

from kinfolk.atomic import write_json
from kinfolk.lab.protocol import get_experiment
from kinfolk.lab.protocol.plan import plan_path, write_plan
from kinfolk.lab.protocol.runner import run_experiment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kinfolk.lab.protocol")
    parser.add_argument("action", choices=["plan", "analyse"])
    parser.add_argument("experiment")
    parser.add_argument("--results", default="docs/results")
    parser.add_argument("--work", default="runs/protocol")
    args = parser.parse_args(argv)
    try:
        experiment = get_experiment(args.experiment)()
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 2
    path = plan_path(args.results, experiment.name)
    if args.action == "plan":
        digest = write_plan(experiment.plan(**experiment.plan_fields()), path)
        print(f"{path}: sha256 {digest}")
        return 0
    results = run_experiment(experiment, path, args.work)
    write_json(f"{args.results}/{experiment.name}.json", results)
    print(f"{args.results}/{experiment.name}.json: plan {results['plan_sha256'][:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
