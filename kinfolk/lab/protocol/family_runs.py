"""Experiments over families whose runs are made (or read back) by a family-runs maker and kept as records.

A `FamilyRunsExperiment`'s settings (a `kinfolk.lab.protocol.settings.FamilySettings`) name its `families`, `runs`
per family and `records` folder; one run's raw record is kept under the key `record_key(family, run)`
(`records/<family>/<run>.json`, `kinfolk.lab.protocol.records.kept_record`), written by the maker
(`family_runs()`, whose `record(family, run)` returns None while another process holds part of the run) once whole,
and read back when its `record_version` is the maker's. A maker whose run is one piece of work subclasses
`ClaimedFamilyRuns` and says in `make` what a run is.

>>> record_key(0, 1)
'0/1'
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from kinfolk import console
from kinfolk.atomic import write_json
from kinfolk.claims import claimed
from kinfolk.lab.protocol.experiment import Experiment
from kinfolk.lab.protocol.records import kept_path, kept_record


def record_key(family: int, run: int) -> str:
    """The key of one family's run among the kept records."""
    return f"{family}/{run}"


class FamilyRunsExperiment(Experiment):
    """Units are `settings.families`, each with `settings.runs` runs, their records kept under `settings.records`."""

    family_runs_class: ClassVar[type]  # made from the settings; `record(family, run) -> dict | None`, `record_version`

    def family_runs(self) -> Any:
        """The maker of this experiment's runs."""
        return self.family_runs_class(self.settings)

    def units(self) -> list[int]:
        return list(self.settings.families)

    def runs_per_unit(self) -> int:
        return self.settings.runs

    def make_run(self, unit: int, run: int) -> Mapping[str, Any] | None:
        kept = kept_record(self.settings.records, record_key(unit, run), self.family_runs_class.record_version)
        return kept or self.family_runs().record(unit, run)

    def load_run(self, unit: int, run: int) -> Mapping[str, Any]:
        record = self.make_run(unit, run)
        if record is None:
            raise RuntimeError(f"family {unit} run {run}: another process holds part of it; analyse when it ends")
        return record

    def provenance(self) -> dict[str, Any]:
        return {"records": self.settings.records}


class ClaimedFamilyRuns:
    """A family-runs maker whose run is made whole by one process: the process claims the run's folder
    (`settings.work/<family>/run<r>`, `kinfolk.claims`) while it makes it, so processes started alike
    share the runs, and writes the record once whole; `make(family, run, where)` says what a run is."""

    record_version: ClassVar[int]
    name: ClassVar[str]  # the experiment's, on the terminal's stage lines

    def __init__(self, settings: Any):
        self.settings = settings
        self.work, self.records = Path(settings.work), Path(settings.records)

    def make(self, family: int, run: int, where: Path) -> dict[str, Any]:
        raise NotImplementedError

    def record(self, family: int, run: int) -> dict[str, Any] | None:
        """The run's record, made here unless kept; None while another process makes it."""
        kept = kept_record(self.records, record_key(family, run), self.record_version)
        if kept is not None:
            return kept
        where = self.work / str(family) / f"run{run}"
        with claimed(where) as ours:
            if not ours:
                return None
            from transformers.utils import logging

            console.stage(f"{self.name}: family {family} run {run}")
            logging.disable_progress_bar()  # a run loads many small models: no bar for each
            try:
                record = self.make(family, run, where)
            finally:
                logging.enable_progress_bar()
        write_json(kept_path(self.records, record_key(family, run)), record)
        return kept_record(self.records, record_key(family, run), self.record_version)  # as read back: JSON's keys
