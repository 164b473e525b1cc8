"""`kinfolk lab build [--quick] [--seed N]`: build (or load) the lab's model family; `kinfolk lab experiment <method>`: an experiment over
families (`atlantis`: `kinfolk.lab.methods.atlantis`, `atlas`: `kinfolk.lab.methods.atlas`, `adapt`:
`kinfolk.lab.methods.adapt`, each with its settings dataclass's options); `kinfolk lab check [FILE ...]`: committed results
against the rules of `docs/protocol.md` (`kinfolk.lab.protocol.checks`).

`build` prints each model's accuracy per skill and the threshold checks, and exits 1 when a model missed one.
`check` checks the named results files, or with none every results file of `--results_dir` (default
`docs/results` of the checkout it runs in, legacy records included): one line per file that passes, one line per
broken rule (file, endpoint, rule) otherwise, and exit 2 when any rule is broken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from kinfolk.commands.parsing import VerbParser
from kinfolk.errors import InputError


@dataclass
class BuildArguments:
    quick: bool = field(default=False, metadata={"help": "The small size for tests and CI (fewer steps)."})
    seed: int = field(default=0, metadata={"help": "Family seed: of the data and of every training run."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Cache root (default ~/.cache/kinfolk/lab or KINFOLK_LAB_CACHE)."}
    )
    force: bool = field(default=False, metadata={"help": "Retrain even when the cache holds the family."})
    record_digests: bool = field(
        default=False,
        metadata={
            "help": "Maintainers, in a checkout: document this build's weight digests (kinfolk/lab/world/digests.json)."
        },
    )
    verbose: bool = field(
        default=False, metadata={"help": "Show the libraries' output (else: KEY.run.log beside it)."}
    )


@dataclass
class ExperimentArguments:
    families: int = field(
        default=5, metadata={"help": "Number of families: seeds first_family ... first_family + families - 1."}
    )
    first_family: int = field(default=0, metadata={"help": "Seed of the first family."})
    quick: bool = field(default=False, metadata={"help": "On quick families (a plumbing check, not evidence)."})
    out: str | None = field(
        default=None, metadata={"help": "Output directory (default runs/lab-<experiment>); an existing one resumes."}
    )
    overwrite: bool = field(default=False, metadata={"help": "Start over instead of resuming an existing --out."})
    cache_dir: str | None = field(default=None, metadata={"help": "Lab family cache root."})
    allow_failed_family: bool = field(
        default=False,
        metadata={"help": "Use families that missed a build threshold (the results list them) instead of stopping."},
    )
    verbose: bool = field(default=False, metadata={"help": "Show the libraries' output (else: OUT/run.log)."})

    def __post_init__(self) -> None:
        if self.families < 1:
            raise InputError(f"--families must be at least 1, got {self.families}")


def build(argv: list[str]) -> int:
    (args,) = VerbParser(BuildArguments, prog="kinfolk lab build").parse(argv)
    from kinfolk.atomic import check_writable
    from kinfolk.console import log_beside, quiet
    from kinfolk.interrupt import keep
    from kinfolk.lab.world.digests import check_family, record_family
    from kinfolk.lab.world.family import LabConfig, build_family, default_cache_dir

    config = LabConfig.quick_config(seed=args.seed) if args.quick else LabConfig(seed=args.seed)
    start = time.perf_counter()
    root = Path(args.cache_dir or default_cache_dir()) / config.cache_key()
    check_writable(root)  # the cache folder the family is trained into, before the log is opened beside it
    keep(f"every model trained to its end, in {root} (a model stopped while training is trained again)")
    with quiet(log_beside(root), "kinfolk lab build", verbose=args.verbose):
        family = build_family(config, cache_dir=args.cache_dir, force=args.force, allow_failed=True)
    print(family.summary())
    print(f"family directory: {family.root} ({time.perf_counter() - start:.0f} s); log: {log_beside(root)}")
    key = config.cache_key()
    if args.record_digests:
        record_family(key, family.models, f"kinfolk lab build{' --quick' * args.quick} --seed {args.seed}")
    print(check_family(key, family.models).line())
    return 0 if family.passed else 1


# experiment -> (module, its settings dataclass, its runner): the experiments on the families runner
EXPERIMENTS = {
    "atlantis": ("kinfolk.lab.methods.atlantis", "AtlantisSettings", "run_atlantis"),
    "atlas": ("kinfolk.lab.methods.atlas", "AtlasSettings", "run_atlas"),
    "adapt": ("kinfolk.lab.methods.adapt", "AdaptSettings", "run_adapt"),
}


def experiment(argv: list[str]) -> int:
    from importlib import import_module

    if argv[:1] and argv[0] in HELP:
        print_usage("kinfolk lab experiment", EXPERIMENTS, __doc__)
        return 0
    if not argv or argv[0] not in EXPERIMENTS:
        choices = ", ".join(EXPERIMENTS)
        raise InputError(f"unknown experiment {' '.join(argv[:1]) or '(none)'!r}; choose an experiment: {choices}")
    from kinfolk.atomic import check_destination, check_writable
    from kinfolk.console import LOG_FILE, quiet
    from kinfolk.interrupt import keep
    from kinfolk.lab.demo.results_page import results_markdown
    from kinfolk.lab.world.family import default_cache_dir

    name = argv[0]
    module_name, settings_class, runner = EXPERIMENTS[name]
    module = import_module(module_name)
    parser = VerbParser((ExperimentArguments, getattr(module, settings_class)), prog=f"kinfolk lab experiment {name}")
    args, settings = parser.parse(argv[1:])
    if args.families < 5:
        print(f"note: {args.families} families give values only, no interval (the lab protocol asks for 5)")
    out = Path(args.out or f"runs/lab-{name}")
    if not out.exists():
        check_destination(out, args.overwrite)  # before the log is opened inside it
    check_writable(args.cache_dir or default_cache_dir())  # where the families are built, before the log too
    keep(f"every finished family's record and each family's finished runs under {out}")
    with quiet(out / LOG_FILE, f"kinfolk lab experiment {name}", verbose=args.verbose):
        results = getattr(module, runner)(
            out,
            list(range(args.first_family, args.first_family + args.families)),
            settings,
            quick=args.quick,
            cache_dir=args.cache_dir,
            allow_failed_family=args.allow_failed_family,
            overwrite=args.overwrite,
        )
    print(results_markdown(results))
    print(f"results: {out}; log: {out / LOG_FILE}")
    return 0


@dataclass
class CheckArguments:
    results_dir: str = field(
        default="docs/results",
        metadata={"help": "With no FILE: check every results file here and in its legacy/ folder (plans excluded)."},
    )


def check(argv: list[str]) -> int:
    from kinfolk.lab.protocol.checks import check_results, results_files

    parser = VerbParser(
        CheckArguments, prog="kinfolk lab check", description="Check results against docs/protocol.md."
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="results JSON files (default: see --results_dir)")
    args, named = parser.parse(argv)
    files = [Path(f) for f in named.files] or results_files(args.results_dir)
    if not files:
        raise InputError(f"{args.results_dir}: no results files here (run in a kinfolk checkout, or name FILEs)")
    checks = [check_results(f) for f in files]
    for result in checks:
        print("\n".join(result.lines()))
    return 0 if all(result.passed for result in checks) else 2


ACTIONS = {"build": build, "experiment": experiment, "check": check}


HELP = ("-h", "--help")


def print_usage(prog: str, choices, doc: str) -> None:
    """Help that starts with a usage line, as every verb's argparse help does."""
    print(f"usage: {prog} {{{','.join(choices)}}} [options]  (`{prog} <choice> --help` lists the options)\n\n{doc}")


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv[:1] and argv[0] in HELP:
        print_usage("kinfolk lab", ACTIONS, __doc__)
        return 0
    if not argv or argv[0] not in ACTIONS:
        raise InputError(f"kinfolk lab needs an action: {' | '.join(ACTIONS)} (got {' '.join(argv[:1]) or 'none'})")
    return ACTIONS[argv[0]](argv[1:])
