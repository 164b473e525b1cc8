"""A planned (confirmatory) comparison: `OUT/plan.json` fixes every setting and the primaries before any run, and
every later call on that `OUT` refuses settings that differ from it.

The primaries are each method against the baseline at each verdict level (`--levels`); the plan's hash is the
fingerprint of the settings and the primaries. plan.json also says whether it preceded the runs: written into an
`OUT` that held no run folder yet (`preceded_runs`), or after some (a plan that may have been fitted to runs
already seen). Without `--plan` and without a plan.json the comparison is exploratory.

>>> from kinfolk.compare.options import CompareArguments
>>> args = CompareArguments(model_name_or_path="m", dataset_name="d", retained_dataset_name=["r"], out="o",
...                         methods=["lora", "atlas"], levels=[0.5], test_split="test", plan=True)
>>> primaries(args)
["atlas vs lora at 50% of lora's gain"]
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinfolk.atomic import fingerprint, write_json
from kinfolk.compare.options import CompareArguments
from kinfolk.errors import InputError
from kinfolk.inputs import read_json

PLAN_FILE = "plan.json"
# where, how loudly and how resumably it runs: no part of what it finds (a resumed run equals an uninterrupted one)
UNPLANNED = ("out", "verbose", "threads", "plan", "run_checkpoints")
# options added after plans were first written: left out while unset, so those plans keep their hashes
NEWER = {"eval_points": None, "retained_nll": False, "method_learning_rates": None}


@dataclass(frozen=True)
class PlanState:
    """The plan a comparison runs under."""

    hash: str
    primaries: list[str]
    preceded_runs: bool  # written before any run of the grid had started

    def describe(self) -> str:
        """report.md's line on the mode."""
        when = "written before any run" if self.preceded_runs else "written after some runs had started"
        return (
            f"Planned comparison: plan.json {self.hash} ({when}) fixed every setting and {len(self.primaries)} "
            "primaries; every choice read validation, every verdict the test split, corrected by Holm over the "
            "primaries."
        )


EXPLORATORY = (
    "Exploratory comparison (no --plan): the rates are chosen on the curves the verdicts read and nothing is "
    "corrected for the several methods and levels; for a confirmatory one use --plan with --test_split."
)


def primaries(args: CompareArguments) -> list[str]:
    """Each method against the baseline at each verdict level."""
    others = [method for method in args.methods if method != args.baseline]
    return [
        f"{m} vs {args.baseline} at {fraction:.0%} of {args.baseline}'s gain"
        for fraction in args.levels
        for m in others
    ]


def settings(args: CompareArguments) -> dict[str, Any]:
    """Every setting that shapes what the comparison finds."""
    return {
        name: value
        for name, value in dataclasses.asdict(args).items()
        if name not in UNPLANNED and not (name in NEWER and value == NEWER[name])
    }


def fix_plan(args: CompareArguments, out: str | Path, run_folders: int) -> PlanState | None:
    """The plan of `out`: read back (refusing settings that differ from it), written now under `--plan`
    (`run_folders`: how many of the grid's run folders exist already), or None for an exploratory comparison."""
    path = Path(out) / PLAN_FILE
    fixed = {"settings": settings(args), "primaries": primaries(args)}
    digest = fingerprint(fixed)
    if not path.is_file():
        if not args.plan:
            return None
        # processes started alike on one OUT: the first plan written stands, the others are checked against it
        _write_once(path, {**fixed, "hash": digest, "preceded_runs": run_folders == 0})
    saved = read_json(path, "comparison plan")
    if saved.get("hash") != digest:
        changed = sorted(
            name for name in {*fixed["settings"], *saved.get("settings", {})}
            if fixed["settings"].get(name) != saved.get("settings", {}).get(name)
        ) or ["the primaries"]  # fmt: skip
        raise InputError(
            f"{path}: these settings differ from the plan's ({', '.join(changed)}); a planned comparison runs "
            "under its plan only: restore them or use another --out"
        )
    return PlanState(digest, saved["primaries"], saved["preceded_runs"])


def _write_once(path: Path, payload: dict[str, Any]) -> None:
    """Write `payload` whole to `path` unless a file is there already (a hard link cannot replace one)."""
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    write_json(staging, payload)
    try:
        os.link(staging, path)
    except FileExistsError:
        pass
    finally:
        staging.unlink()
