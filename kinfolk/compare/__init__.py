"""`kinfolk compare`'s library: methods x learning rates x seeds trained and measured, each method's rate chosen on
validation, and the matched-gain verdicts at the chosen rates.

- `grid`: the runs, their folders and `run.json` records, training them with resume per run;
- `selection`: the rule that chooses each method's learning rate on the validation curves;
- `verdicts`: one line per method and level against the baseline (`kinfolk.drift`'s matching and intervals);
- `analysis`: the two together, from every run's curve;
- `report`: the report folder (report.md, report.json, curves.png and a `kinfolk drift` report per method).

The command (`kinfolk.commands.compare`) trains the runs with `kinfolk sft`'s trainer and kinfolk's callbacks and
hands their logs here; docs/compare.md describes the whole.
"""

from kinfolk.compare.analysis import Analysis, analyse
from kinfolk.compare.grid import RunKey, RunRecord, check_settings, read_record, run_grid, run_keys
from kinfolk.compare.selection import RateChoice, choose_rate, selection_level
from kinfolk.compare.verdicts import Verdict, report_levels, verdicts

__all__ = [
    "Analysis",
    "RateChoice",
    "RunKey",
    "RunRecord",
    "Verdict",
    "analyse",
    "check_settings",
    "choose_rate",
    "read_record",
    "report_levels",
    "run_grid",
    "run_keys",
    "selection_level",
    "verdicts",
]
