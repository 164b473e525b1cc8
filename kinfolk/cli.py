"""The `kinfolk <verb>` dispatcher.

Each verb lives in its own module, which exposes `main(argv: list[str] | None) -> int` and parses its own
arguments (so `kinfolk sft` can reuse TRL's parser and `kinfolk eval` lm-eval's). The dispatcher only knows
the verb names, their one-line help and where they live; it imports a verb's module when that verb runs,
which keeps `kinfolk --help` fast.

>>> from kinfolk.cli import main
>>> main(["--version"])  # doctest: +SKIP
kinfolk 0.1.0
0
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kinfolk import __version__

# verb -> (module with `main(argv)`, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "env": ("kinfolk.env", "print the installed stack, the torch device and the registered kinfolk plugins"),
    "eval": ("kinfolk.lm_eval_cli", "lm-eval's CLI with kinfolk's adapter types and tasks registered"),
    "churn": ("kinfolk.callbacks.churn", "answer churn (C/F/G/W) between lm-eval sample logs, with paired intervals"),
    "drift": ("kinfolk.drift_report", "retained KL at matched target scores across methods and seeds (report)"),
    "sft": ("kinfolk.trainers.sft_cli", "`trl sft` with WeightedSFTTrainer: per-example weights, prompt loss weight"),
    "score": (
        "kinfolk.trainers.atlantis.cli",
        "ATLANTIS: score an SFT dataset with three models, add a weight column",
    ),
    "merge": (
        "kinfolk.plugins.adapt.cli",
        "ADAPT merges: init-student, delta, delta-cosine, apply-delta, patch, interpolate",
    ),
    "lab": ("kinfolk.lab.cli", "the lab: build the tiny CPU-trained model family with known ground truth"),
    "demo": ("kinfolk.lab.demo", "ATLANTIS, ATLAS and ADAPT on the lab family, measured; writes report.md"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinfolk",
        description="kinfolk: ATLANTIS weighted SFT, ATLAS adapters, ADAPT merges and drift measurement.",
        epilog="Run `kinfolk <verb> --help` for a verb's own options.",
    )
    parser.add_argument("--version", action="version", version=f"kinfolk {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>")
    for name, (_, help_text) in VERBS.items():
        verbs.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in VERBS:
        parser.parse_args(argv)  # handles --help, --version and unknown verbs with argparse's own messages
        parser.print_help()
        return 2
    module_name, _ = VERBS[argv[0]]
    verb_main = importlib.import_module(module_name).main
    return int(verb_main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
