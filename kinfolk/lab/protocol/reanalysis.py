"""A protocol-2 re-analysis of an earlier version's committed runs (`docs/results/<experiment>-families/`).

The runs are not repeated: `load_run` reads a unit's committed record and hands it on in the experiment's
split-labelled form (`split_record`), in which every number measured on test sits under a `test` key, so the
selection stage's view cannot reach it. The plan names the commit the records came from; their runs per unit are
whatever those runs had.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from kinfolk.lab.protocol.experiment import Experiment

RESULTS_DIR = Path("docs/results")


def grid_key(value: float) -> str:
    """How the committed records key a grid value (a temperature, a level): `1.0` -> `"1"`, `0.5` -> `"0.5"`."""
    return f"{value:g}"


class Reanalysis(Experiment):
    """An experiment whose runs are the committed records of an earlier version."""

    records_dir: ClassVar[str]  # under RESULTS_DIR
    runs_commit: ClassVar[str]  # the commit whose records are analysed (fixed in the plan)
    notes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: Any | None = None, results_dir: str | Path = RESULTS_DIR) -> None:
        super().__init__(settings)
        self.results_dir = Path(results_dir)

    def units(self) -> list[int]:
        return [0, 1, 2, 3, 4]

    def plan_fields(self) -> dict[str, Any]:
        return {"reanalysis": True, "runs_commit": self.runs_commit, "notes": list(self.notes)}

    def committed(self, unit: int) -> dict[str, Any]:
        return json.loads((self.results_dir / self.records_dir / f"{unit}.json").read_text())

    def load_run(self, unit: int, run: int) -> Mapping[str, Any]:
        return self.split_record(self.committed(unit), run)

    def runs_made_elsewhere(self) -> str | None:
        return (
            f"{self.name} re-analyses the committed records in {self.results_dir / self.records_dir} (made at commit "
            f"{self.runs_commit}): it has no runs to make; `kinfolk lab experiment {self.name} analyse` reads them"
        )

    def split_record(self, committed: dict[str, Any], run: int) -> dict[str, Any]:
        """The committed record of one run with every test measurement under a `test` key."""
        raise NotImplementedError

    def provenance(self) -> dict[str, Any]:
        return {"records": str(self.results_dir / self.records_dir), "notes": list(self.notes)}
