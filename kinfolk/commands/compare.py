"""`kinfolk compare`: methods x learning rates x seeds trained from one model, each method's rate chosen on
validation, and the matched-gain report with a verdict per level against the baseline.

    kinfolk compare --model_name_or_path SmolLM2-135M-Instruct --dataset_name target/ \\
        --retained_dataset_name retained/ --methods lora atlas lora_output_kl --learning_rates 1e-4 3e-4 1e-3 \\
        --seeds 0 1 2 3 4 --max_steps 200 --eval_steps 20 --out runs/compare

Every run trains with `kinfolk sft`'s trainer and logs its target score and retained KL to
`OUT/runs/<method>/lr-<rate>/seed-<seed>/drift.jsonl` (`kinfolk.commands.compare_runs`); the rate choice, the
verdicts and the report are `kinfolk.compare`'s. Rerunning the command resumes: finished runs are skipped.
docs/compare.md describes the rule and the report.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kinfolk.commands.compare_options import CompareArguments
from kinfolk.commands.parsing import VerbParser

PROG = "kinfolk compare"
REPORT_FOLDER = "report"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    (args,) = VerbParser(CompareArguments, prog=PROG, description=__doc__.split("\n\n")[0]).parse(argv)
    from kinfolk.atomic import check_writable
    from kinfolk.commands.compare_runs import CompareRuns
    from kinfolk.compare.analysis import analyse
    from kinfolk.compare.grid import RUNS_FOLDER, run_grid
    from kinfolk.compare.report import write_report
    from kinfolk.console import LOG_FILE, quiet, show
    from kinfolk.interrupt import keep

    out = Path(args.out)
    check_writable(out / LOG_FILE)  # a path under a file, or one that takes no new files: refused here
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    runs = CompareRuns(args)  # every input checked before any model loads
    keep(f"every finished run under {out / RUNS_FOLDER} (its run.json); the rerun trains only the others")
    with quiet(out / LOG_FILE, PROG, verbose=args.verbose):
        trained = run_grid(runs.keys, out, runs.settings, args.max_steps, runs.train, runs.load)
        analysis = analyse(trained, args.baseline, args.selection_fraction, args.levels)
        write_report(analysis, out / REPORT_FOLDER, runs.about(), runs.target)
    show("\n".join(verdict.line for verdict in analysis.verdicts))
    show(f"report: {out / REPORT_FOLDER / 'report.md'}")
    return 0
