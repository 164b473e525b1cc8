"""Experiments over families whose runs are made (or read back) by a family-runs maker and kept as records.

A `FamilyRunsExperiment`'s settings (a `kinfolk.lab.protocol.settings.FamilySettings`) name its `families`, `runs`
per family and `records` folder; one run's raw record is kept under the key `record_key(family, run)`
(`records/<family>/<run>.json`, `kinfolk.lab.protocol.records.kept_record`), written by the maker
(`family_runs()`, whose `record(family, run)` returns None while another process holds part of the run) once whole,
and read back when its `record_version` is the experiment's.

>>> record_key(0, 1)
'0/1'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from kinfolk.lab.protocol.experiment import Experiment
from kinfolk.lab.protocol.records import kept_record


def record_key(family: int, run: int) -> str:
    """The key of one family's run among the kept records."""
    return f"{family}/{run}"


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
        kept = kept_record(self.settings.records, record_key(unit, run), self.record_version)
        return kept or self.family_runs().record(unit, run)

    def load_run(self, unit: int, run: int) -> Mapping[str, Any]:
        record = self.make_run(unit, run)
        if record is None:
            raise RuntimeError(f"family {unit} run {run}: another process holds part of it; analyse when it ends")
        return record

    def provenance(self) -> dict[str, Any]:
        return {"records": self.settings.records}
