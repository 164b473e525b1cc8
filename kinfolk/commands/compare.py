"""`kinfolk compare`: methods x learning rates x seeds trained from one model, each method's rate chosen on
validation, and the matched-gain report with a verdict per level against the baseline.

    kinfolk compare --model_name_or_path SmolLM2-135M-Instruct --dataset_name target/ \\
        --retained_dataset_name retained/ --methods lora atlas lora_output_kl --learning_rates 1e-4 3e-4 1e-3 \\
        --seeds 0 1 2 3 4 --max_steps 200 --eval_steps 20 --out runs/compare

Every run trains with `kinfolk sft`'s trainer and logs its target score and retained KL to
`OUT/runs/<method>/lr-<rate>/seed-<seed>/drift.jsonl`; the runs, the rate choice, the verdicts and the report are
`kinfolk.compare`'s. Rerunning the command resumes: finished runs are skipped. docs/compare.md describes the rule
and the report.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kinfolk.commands.parsing import VerbParser
from kinfolk.compare.options import CompareArguments

PROG = "kinfolk compare"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    (args,) = VerbParser(CompareArguments, prog=PROG, description=__doc__.split("\n\n")[0]).parse(argv)
    from kinfolk.compare.comparison import REPORT_FOLDER, run_comparison
    from kinfolk.console import show

    analysis = run_comparison(args, PROG)
    if analysis is None:
        show("another process still trains a run of this comparison: the last one to finish writes the report")
        return 0
    show("\n".join(verdict.line for verdict in analysis.verdicts))
    reached = ", ".join(f"{method} {share:.0%}" for method, share in analysis.reached.items() if share is not None)
    if reached:
        show(f"share of {analysis.baseline}'s gain reached: {reached}")
    for warning in analysis.edge_warnings:
        show(f"warning: {warning}")
    show(f"report: {Path(args.out) / REPORT_FOLDER / 'report.md'}")
    return 0
