"""`kinfolk compare`, whole: methods x learning rates x seeds trained and measured, each method's rate chosen on
validation, and the matched-gain verdicts at the chosen rates. An app (it trains with kinfolk's trainers and
callbacks); the lab's ATLAS experiments build their adapters from its method registry.

- `options`: the command's options (`CompareArguments`), checked as parsed;
- `runs`: how one run trains and is measured (`CompareRuns`), every input checked before any model loads;
- `grid`: the runs, their folders and `run.json` records, training them with resume per run;
- `selection`: the rule that chooses each method's learning rate on the validation curves;
- `verdicts`: one line per method and level against the baseline (`kinfolk.drift`'s matching and intervals);
- `grid_edge`: the warning when a chosen rate sits at its grid's end;
- `analysis`: the two together, from every run's curve (with the share of the baseline's gain each method reaches);
- `answers`: the retained prompts' greedy answers each run keeps, and the answer churn at a level;
- `figures`: compare.png (every chosen method on one pair of axes) and curves.png (the rate choice);
- `report`: the report folder (report.md, report.json, the figures and a `kinfolk drift` report per method);
- `comparison`: all of it in order, what `kinfolk compare` calls.

Names are imported on first use (`kinfolk.lazy`), so the command's `--help` loads no training stack;
docs/compare.md describes the whole.
"""

from kinfolk.lazy import lazy_exports

EXPORTS = {
    "kinfolk.compare.analysis": ("Analysis", "analyse"),
    "kinfolk.compare.grid": ("RunKey", "RunRecord", "check_settings", "read_record", "run_grid", "run_keys"),
    "kinfolk.compare.selection": ("RateChoice", "choose_rate"),
    "kinfolk.compare.verdicts": ("Verdict",),  # not `verdicts`: the submodule of that name would shadow it
}
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
__all__ = sorted(name for names in EXPORTS.values() for name in names)
