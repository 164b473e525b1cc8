"""`kinfolk lab build [--quick] [--seed N]`: build (or load) the lab's model family; `kinfolk lab experiment NAME
plan|run|analyse`: one registered experiment (`kinfolk.lab.protocol.EXPERIMENTS`) through the protocol; `kinfolk lab check
[FILE ...]`: committed results against the rules of `docs/protocol.md` (`kinfolk.lab.protocol.checks`).

`build` prints each model's accuracy per skill and the threshold checks, and exits 1 when a model missed one.
`experiment NAME plan` writes `docs/results/NAME.plan.json` (never over a different plan), `run` makes the plan's
records (`--families`/`--seeds F ...`, `--runs R ...`: some of them; processes started alike share them; `--pilot`:
the pilot that chose the settings, where there was one), `analyse` writes `docs/results/NAME.json` from the
committed plan and the kept records (`kinfolk.lab.protocol.actions`).
`check` checks the named results files, or with none every results file of `--results_dir` (default
`docs/results` of the checkout it runs in, legacy records included) and then whether that checkout's README
evidence table and docs/results.md are the ones its results generate: one line per file that passes, one line per
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
class PlanArguments:
    results: str = field(default="docs/results", metadata={"help": "Folder of the plan files and results."})


@dataclass
class RunArguments:
    units: list[int] | None = field(
        default=None,
        metadata={
            "help": "The plan's units to run, families or seeds as its unit kind is (default: every unit).",
            "aliases": ["--families", "--seeds"],
        },
    )
    runs: list[int] | None = field(default=None, metadata={"help": "Runs of each unit (default: every run)."})
    pilot: bool = field(
        default=False, metadata={"help": "The pilot that chose the plan's settings instead (real-atlas has one)."}
    )
    figure: str | None = field(
        default=None, metadata={"help": "Then draw the runs' curves into this PNG (real-atlas, real-boomerang)."}
    )
    verbose: bool = field(
        default=False, metadata={"help": "Show the libraries' output (else: runs/NAME/run-PID.log)."}
    )


@dataclass
class AnalyseArguments:
    results: str = field(default="docs/results", metadata={"help": "Folder of the committed plan and the results."})
    work: str = field(default="runs/protocol", metadata={"help": "Where the protocol's per-run records are kept."})


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


EXPERIMENT_ACTIONS = {"plan": PlanArguments, "run": RunArguments, "analyse": AnalyseArguments}
UNIT_OPTIONS = {"--families": "family", "--seeds": "seed"}  # how `--units` may be spelled, per unit kind
PLURAL = {"family": "families", "seed": "seeds"}


def experiment(argv: list[str]) -> int:
    from kinfolk.lab.protocol import EXPERIMENTS

    prog = "kinfolk lab experiment"
    if argv[:1] and argv[0] in HELP:
        print_usage(prog, sorted(EXPERIMENTS), __doc__)
        return 0
    if not argv or argv[0] not in EXPERIMENTS:
        choices = ", ".join(sorted(EXPERIMENTS))
        raise InputError(f"unknown experiment {' '.join(argv[:1]) or '(none)'!r}; choose an experiment: {choices}")
    name = argv[0]
    if argv[1:2] and argv[1] in HELP:
        print_usage(f"{prog} {name}", EXPERIMENT_ACTIONS, __doc__)
        return 0
    if argv[1:2] == [] or argv[1] not in EXPERIMENT_ACTIONS:
        actions = " | ".join(EXPERIMENT_ACTIONS)
        raise InputError(f"{prog} {name} needs an action: {actions} (got {' '.join(argv[1:2]) or 'none'})")
    action = argv[1]
    (args,) = VerbParser(EXPERIMENT_ACTIONS[action], prog=f"{prog} {name} {action}").parse(argv[2:])
    from kinfolk.lab.protocol import get_experiment

    chosen = get_experiment(name)()
    if action == "plan":
        from kinfolk.lab.protocol.actions import write_experiment_plan

        path, digest = write_experiment_plan(chosen, args.results)
        print(f"{path}: sha256 {digest}")
    elif action == "run":
        _make_runs(chosen, args, argv[2:])
    else:
        from kinfolk.atomic import check_writable
        from kinfolk.interrupt import keep
        from kinfolk.lab.protocol.actions import analyse

        check_writable(args.work)  # where each run's protocol record is kept, before the first is made
        keep(f"each run's protocol record under {args.work}/{name}")
        path, results = analyse(chosen, args.results, args.work)
        print(f"{path}: plan {results['plan_sha256'][:12]}")
    return 0


def _make_runs(chosen, args: RunArguments, argv: list[str]) -> None:
    """`kinfolk lab experiment NAME run`: the plan's records (or the pilot's choices), then the figure asked for."""
    import os

    from kinfolk.console import quiet, show
    from kinfolk.interrupt import keep
    from kinfolk.lab.protocol.actions import make_runs, run_keys

    prog = f"kinfolk lab experiment {chosen.name} run"
    for option, kind in UNIT_OPTIONS.items():
        if any(a == option or a.startswith(f"{option}=") for a in argv) and kind != chosen.unit_kind:
            units = PLURAL[chosen.unit_kind]
            raise InputError(f"{chosen.name}: its units are {units}, not {PLURAL[kind]} ({option}); use --{units}")
    pilot = chosen.pilot() if args.pilot else None
    if args.pilot and pilot is None:
        raise InputError(f"{chosen.name} has no pilot (--pilot): its settings were fixed without one")
    if args.pilot and (args.units is not None or args.runs is not None or args.figure):
        raise InputError(f"{chosen.name}: --pilot runs the pilot's own seed, without --units, --runs or --figure")
    plot = chosen.runs_figure() if args.figure else None
    if args.figure and plot is None:
        raise InputError(
            f"{chosen.name} draws no figure of its runs (--figure); its primaries' figure: docs/results.md"
        )
    keys = [] if args.pilot else run_keys(chosen, args.units, args.runs)
    log = Path("runs") / chosen.name / f"run-{os.getpid()}.log"
    settings = chosen.settings
    keep(f"every whole run's record in {settings.records} and each run's finished parts under {settings.work}")
    with quiet(log, prog, verbose=args.verbose):
        if pilot is not None:
            chosen_file = pilot()
            show(f"pilot choices: {chosen_file}" if chosen_file else "pilot: another process holds some of its runs")
            return
        records = make_runs(chosen, keys)
        show(f"{chosen.name}: {len(records)} records kept in {settings.records}; log: {log}")
        if plot is not None:
            show(f"curves: {plot(records, args.figure)}")


@dataclass
class CheckArguments:
    results_dir: str = field(
        default="docs/results",
        metadata={"help": "With no FILE: check every results file here and in its legacy/ folder (plans excluded)."},
    )


def check(argv: list[str]) -> int:
    from kinfolk.lab.demo.results_page import stale_generated
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
    results_dir = Path(args.results_dir).resolve()
    checkout = results_dir.parents[1] if results_dir.parent.name == "docs" and not named.files else None
    stale = stale_generated(checkout) if checkout else []
    for line in stale:  # README and docs/results.md of the checkout whose docs/results was checked
        print(f"{line} (breaks generated)")
    return 0 if all(result.passed for result in checks) and not stale else 2


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
