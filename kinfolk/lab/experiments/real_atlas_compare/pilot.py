"""The pilot of real-atlas version 2: seed `PILOT_SEED` (not a unit), `kinfolk compare`'s whole command on that
seed's data, on a reduced grid, timed. It ran before the plan with the first design's budget and measuring (64 steps,
rows of 128 tokens, 8 geometric measuring steps), which the plan then cut; its numbers are in the plan's notes.

`kinfolk lab experiment real-atlas-compare run --pilot` runs it (resuming: kept runs are read back) and writes
`PILOT_FILE`: per run its rate, seconds, validation curve (step, target, drift) and the seconds each kind of
measurement took at each step, with compare's verdict lines (one seed: measurements, not findings).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kinfolk.lab.methods.real_atlas_compare.settings import PILOT_SEED, RealAtlasCompareSettings

PILOT_FILE = "pilot.json"  # in the records folder
PILOT_OUT = "pilot/lora-atlas"  # under the work folder
# the first design's budget and measuring (the plan then cut them; its seed's data kept all 3,630 training rows)
PILOT_OPTIONS = {"max_steps": 64, "eval_steps": 64, "max_length": 128, "eval_points": 8}
PILOT_RATES = {"lora": [3e-3], "atlas": [1e-2]}  # version 1's rates, timed (its pilot chose them at this budget)


def pilot_args(settings: RealAtlasCompareSettings):
    """The pilot's `CompareArguments`: the main arm's on the pilot seed, exploratory, LoRA and ATLAS only."""
    from kinfolk.lab.methods.real_atlas_compare.runs import RealAtlasCompareRuns

    args = RealAtlasCompareRuns(settings).arm_args(PILOT_SEED)
    own = [f"{method}={','.join(f'{rate:g}' for rate in rates)}" for method, rates in PILOT_RATES.items()
           if method != "lora"]  # fmt: skip
    return dataclasses.replace(args, out=str(Path(settings.work) / PILOT_OUT), methods=list(PILOT_RATES),
                               learning_rates=PILOT_RATES["lora"], method_learning_rates=own, plan=False,
                               **PILOT_OPTIONS)  # fmt: skip


def run_pilot(settings: RealAtlasCompareSettings) -> Path | None:
    """Run (or read back) the pilot and write `PILOT_FILE`; None while another process trains one of its runs."""
    from kinfolk.atomic import write_json
    from kinfolk.compare import grid
    from kinfolk.compare.comparison import run_comparison
    from kinfolk.drift.log import read_rows
    from kinfolk.lab.methods.real_atlas_compare.runs import PROG

    args = pilot_args(settings)
    analysis = run_comparison(args, f"{PROG} --pilot")
    if analysis is None:
        return None
    runs: dict[str, Any] = {}
    for key, run in analysis.runs.items():
        record = grid.read_record(key.folder(args.out))
        seconds: dict[str, dict[int, float]] = {}
        for row in read_rows(key.folder(args.out)):
            for name, value in row.items():
                if name == "seconds" or name.endswith("_seconds"):
                    measured = next(n for n in row if n.startswith(("retained_", "test/", "target")))
                    seconds.setdefault(measured, {})[row["step"]] = value
        runs[key.name] = {
            "method": key.method,
            "learning_rate": key.learning_rate,
            "seconds": record.seconds,
            "validation": [list(point) for point in sorted(run.checkpoints)],
            "measuring_seconds": seconds,
        }
    path = Path(settings.records) / PILOT_FILE
    write_json(path, {"seed": PILOT_SEED, "options": PILOT_OPTIONS, "runs": runs,
                      "verdicts": [verdict.line for verdict in analysis.verdicts]})  # fmt: skip
    return path
