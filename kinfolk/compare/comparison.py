"""One comparison from its checked options to its report: the plan fixed or checked (`plan`), every run of the grid
trained or read back (shared with other processes on the same `OUT`), each method's rate chosen, the verdicts, and
the report folder; `kinfolk compare` parses its options and calls `run_comparison`."""

from __future__ import annotations

from pathlib import Path

from kinfolk.compare.analysis import Analysis
from kinfolk.compare.options import CompareArguments

REPORT_FOLDER = "report"


def run_comparison(args: CompareArguments, prog: str) -> Analysis | None:
    """Check every input, train the runs not finished yet (resuming), choose, judge and write `OUT/report/`.
    `prog` names the command in the log's first line. None when another process on the same `OUT` still trains a
    run: the last one to finish writes the report."""
    from kinfolk.atomic import check_writable
    from kinfolk.compare import grid
    from kinfolk.compare.analysis import analyse
    from kinfolk.compare.plan import EXPLORATORY, fix_plan
    from kinfolk.compare.report import write_report
    from kinfolk.compare.runs import CompareRuns
    from kinfolk.console import LOG_FILE, quiet
    from kinfolk.interrupt import keep

    out = Path(args.out)
    check_writable(out / LOG_FILE)  # a path under a file, or one that takes no new files: refused here
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    keys = grid.run_keys(args.methods, args.rate_grid(), args.seeds)
    plan = fix_plan(args, out, sum(key.folder(out).exists() for key in keys))  # before any model loads
    runs = CompareRuns(args)  # every input checked before any model loads
    keep(f"every finished run under {out / grid.RUNS_FOLDER} (its run.json); the rerun trains only the others")
    with quiet(out / LOG_FILE, prog, verbose=args.verbose):
        curves = grid.run_grid(runs.keys, out, runs.settings, args.max_steps, runs.train, runs.load)
        if curves is None:
            return None
        test = {key: curve.test for key, curve in curves.items()} if args.test_split is not None else None
        analysis = analyse(
            {key: curve.validation for key, curve in curves.items()},
            args.baseline,
            args.selection_fraction,
            args.levels,
            test=test,
            sources={key: curve.sources for key, curve in curves.items()},
            nll={key: curve.nll for key, curve in curves.items()} if args.retained_nll else None,
            planned=plan is not None,
        )
        mode = EXPLORATORY if plan is None else plan.describe()
        write_report(analysis, out / REPORT_FOLDER, [mode, *runs.about()], runs.target)
    return analysis
