"""Experiments over families whose runs are made (or read back) by a family-runs maker and kept as records.

A `FamilyRunsExperiment`'s settings name its `families`, `runs` per family and `records` folder; one run's raw
record is `records/<family>/<run>.json`, written by the maker (`family_runs()`, whose `record(family, run)` returns
None while another process holds part of the run) once whole, and read back (`kept_record`) when its
`record_version` is the experiment's.

>>> import tempfile
>>> kept_record(tempfile.mkdtemp(), family=0, run=1, version=1) is None
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from kinfolk.lab.protocol.experiment import Experiment


def kept_record(records: str | Path, family: int, run: int, version: int) -> dict[str, Any] | None:
    """The kept record of one family's run, or None when there is none of this record version."""
    path = Path(records) / str(family) / f"{run}.json"
    kept = json.loads(path.read_text()) if path.exists() else None
    return kept if kept is not None and kept.get("record_version") == version else None


class FamilyRunsExperiment(Experiment):
    """Units are `settings.families`, each with `settings.runs` runs, their records kept under `settings.records`."""

    record_version: ClassVar[int]
    family_runs_class: ClassVar[type]  # made from the settings; `record(family, run) -> dict | None`

    def family_runs(self) -> Any:
        """The maker of this experiment's runs."""
        return self.family_runs_class(self.settings)

    def units(self) -> list[int]:
        return list(self.settings.families)

    def runs_per_unit(self) -> int:
        return self.settings.runs

    def make_run(self, unit: int, run: int) -> Mapping[str, Any] | None:
        kept = kept_record(self.settings.records, unit, run, self.record_version)
        return kept or self.family_runs().record(unit, run)

    def load_run(self, unit: int, run: int) -> Mapping[str, Any]:
        record = self.make_run(unit, run)
        if record is None:
            raise RuntimeError(f"family {unit} run {run}: another process holds part of it; analyse when it ends")
        return record

    def provenance(self) -> dict[str, Any]:
        return {"records": self.settings.records}
