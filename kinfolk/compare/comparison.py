"""One comparison from its checked options to its report: every run of the grid trained (or read back), each
method's rate chosen, the verdicts, and the report folder; `kinfolk compare` parses its options and calls
`run_comparison`."""

from __future__ import annotations

from pathlib import Path

from kinfolk.compare.analysis import Analysis
from kinfolk.compare.options import CompareArguments

REPORT_FOLDER = "report"


def run_comparison(args: CompareArguments, prog: str) -> Analysis:
    """Check every input, train the runs not finished yet (resuming), choose, judge and write `OUT/report/`.
    `prog` names the command in the log's first line."""
    from kinfolk.atomic import check_writable
    from kinfolk.compare import grid
    from kinfolk.compare.analysis import analyse
    from kinfolk.compare.report import write_report
    from kinfolk.compare.runs import CompareRuns
    from kinfolk.console import LOG_FILE, quiet
    from kinfolk.interrupt import keep

    out = Path(args.out)
    check_writable(out / LOG_FILE)  # a path under a file, or one that takes no new files: refused here
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    runs = CompareRuns(args)  # every input checked before any model loads
    keep(f"every finished run under {out / grid.RUNS_FOLDER} (its run.json); the rerun trains only the others")
    with quiet(out / LOG_FILE, prog, verbose=args.verbose):
        trained = grid.run_grid(runs.keys, out, runs.settings, args.max_steps, runs.train, runs.load)
        analysis = analyse(trained, args.baseline, args.selection_fraction, args.levels)
        write_report(analysis, out / REPORT_FOLDER, runs.about(), runs.target)
    return analysis
