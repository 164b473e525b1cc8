"""Drift at matched gain: which method moves retained outputs least to reach the same target score.

`matching` reads each run's drift at target levels off its own (target, drift) curve, interpolated along the
running-maximum envelope of the target and never extrapolated, and compares methods over seeds; `render` writes
the report; `log` writes and reads a run's `drift.jsonl` (docs/measurement.md gives the row format) and reads its
curve (`load_run`). `kinfolk drift` (`kinfolk.commands.drift`) parses its options and calls these. `churn` measures drift in answers rather than probabilities: how many retained
answers an adapted model changed against the frozen one (`kinfolk churn`, `LmEvalCallback`, `kinfolk compare`).

>>> from kinfolk.drift import Run, target_matched
>>> runs = [Run("atlas", "1", "a", [(1, 1.0, 0.01), (2, 3.0, 0.04)]),
...         Run("lora", "1", "l", [(1, 1.0, 0.02), (3, 3.0, 0.08)])]
>>> report = target_matched(runs, "atlas", requirements=[2.0])
>>> round(report.comparisons[0].ratio, 6)  # √(.01·.04) / √(.02·.08)
0.5
"""

from kinfolk.drift.log import load_run
from kinfolk.drift.matching import (
    INTERPOLATION,
    Comparison,
    LevelValue,
    MatchedGain,
    MethodSummary,
    Run,
    RunResult,
    Unreached,
    parse_requirements,
    shared_requirements,
    target_matched,
)
from kinfolk.drift.render import markdown, plot, write_report

__all__ = [
    "INTERPOLATION",
    "Comparison",
    "LevelValue",
    "MatchedGain",
    "MethodSummary",
    "Run",
    "RunResult",
    "Unreached",
    "load_run",
    "markdown",
    "parse_requirements",
    "plot",
    "shared_requirements",
    "target_matched",
    "write_report",
]
