"""`kinfolk lab build [--quick] [--seed N] [--cache_dir DIR] [--force]`: build (or load) the lab's model family;
`kinfolk lab experiment atlantis --seeds N`: the ATLANTIS experiment (`kinfolk.lab.experiment`).

`build` prints each model's accuracy per skill and the threshold checks; exits 1 when a model missed its threshold.
"""

from __future__ import annotations

import argparse
import time


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinfolk lab", description="The lab: a tiny model family with known ground truth."
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="<action>")
    build = actions.add_parser("build", help="train (or load from the cache) the lab's model family")
    build.add_argument("--quick", action="store_true", help="the small size for tests and CI (fewer steps)")
    build.add_argument("--seed", type=int, default=0, help="seed of the data and every training run")
    build.add_argument(
        "--cache_dir", default=None, help="cache root (default ~/.cache/kinfolk/lab or KINFOLK_LAB_CACHE)"
    )
    build.add_argument("--force", action="store_true", help="retrain even when the cache holds the family")
    build.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    actions.add_parser(
        "experiment", help="measure a method over seeds: `kinfolk lab experiment atlantis --help`", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv[:1] == ["experiment"]:
        from kinfolk.lab.experiment import main as experiment_main

        return experiment_main(argv[1:])
    args = build_parser().parse_args(argv)
    import torch

    from kinfolk.lab.family import LabConfig, build_family

    if args.threads:
        torch.set_num_threads(args.threads)
    config = LabConfig.quick_config(seed=args.seed) if args.quick else LabConfig(seed=args.seed)
    start = time.perf_counter()
    family = build_family(config, cache_dir=args.cache_dir, force=args.force)
    print(family.summary())
    print(f"family directory: {family.root} ({time.perf_counter() - start:.0f} s)")
    return 0 if family.passed else 1
