"""The contract every lab experiment (and every real-checkpoint experiment) follows.

An `Experiment` has a typed settings dataclass, declares its primary endpoints (at most six, `PrimaryEndpoint`)
and its exploratory ones, and splits its work into two stages:

- `select(view)`: every choice a reported number depends on, made from a `SelectionView` of one run's raw record,
  which has no test fields (reading one raises `TestFieldAccess`). It returns the choices as plain JSON.
- `analyse(record, selection)`: the full record and those choices in; each endpoint's `EndpointValue` out (the
  test numbers of what was selected, with their absolute values and grid-edge flags).

`load_run(unit, run)` produces the raw record of one run of one unit (training it, or, for a re-analysis, reading
the committed one). `kinfolk.lab.protocol.runner` drives the stages over the plan's units and runs;
`kinfolk.lab.protocol.actions` is what `kinfolk lab experiment NAME plan|run|analyse` does with them: `run` makes
the records (`make_run`, shared by processes started alike), with the experiment's `pilot` or `runs_figure` where
it has them.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from kinfolk.lab.protocol.plan import Plan, PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.views import SelectionView


@dataclass(frozen=True)
class ExploratoryEndpoint:
    """An endpoint reported with its interval but never tested or claimed (no p-value, no correction)."""

    name: str
    description: str
    baseline: str | None = None
    direction: Literal["higher", "lower"] = "higher"
    null: float = 0.0


class Experiment(ABC):
    """One experiment version. Subclasses set `name`, `version`, `unit_kind`, `settings_class` and implement the
    stages; `plan()` writes down what the runner will hold them to."""

    name: ClassVar[str]
    version: ClassVar[str]
    unit_kind: ClassVar[Literal["family", "seed"]] = "family"
    settings_class: ClassVar[type]

    def __init__(self, settings: Any | None = None) -> None:
        self.settings = settings if settings is not None else self.settings_class()

    @abstractmethod
    def primaries(self) -> list[PrimaryEndpoint]:
        """The declared primary endpoints, in the plan's order."""

    def exploratory(self) -> list[ExploratoryEndpoint]:
        return []

    @abstractmethod
    def units(self) -> list[int]: ...

    def runs_per_unit(self) -> int:
        return 1

    @abstractmethod
    def selection_rules(self) -> dict[str, str]:
        """In words, per choice: the split it is made on and the rule."""

    @abstractmethod
    def load_run(self, unit: int, run: int) -> Mapping[str, Any]:
        """The raw record of one run of one unit."""

    @abstractmethod
    def select(self, view: SelectionView) -> dict[str, Any]:
        """Every choice, from the validation (or calibration) view of one run's record."""

    @abstractmethod
    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        """The endpoints' values for one run, from its full record and its selection."""

    def make_run(self, unit: int, run: int) -> Mapping[str, Any] | None:
        """Make one run's raw record and keep it where `load_run` reads it (read back once kept); None while another
        process holds part of it. By default `load_run`'s record, which is made when it is not kept yet."""
        return self.load_run(unit, run)

    def runs_made_elsewhere(self) -> str | None:
        """Why `kinfolk lab experiment NAME run` has nothing to make (a re-analysis reads committed records), or None."""
        return None

    def pilot(self) -> Callable[[], Path | None] | None:
        """What runs the pilot that chose the plan's settings and writes its choices (returning their file; None while
        another process holds one of its runs), if the experiment had a pilot."""
        return None

    def runs_figure(self) -> Callable[[list[Mapping[str, Any]], str | Path], Path] | None:
        """What draws every unit's kept record (one run per unit) into a figure file, if the experiment has one."""
        return None

    def floor(self, endpoint: str) -> float | None:
        """The measured floor under a ratio endpoint (None: not a ratio, or not measured; the results say which)."""
        return None

    def value_range(self, endpoint: str) -> tuple[float, float] | None:
        """The range a bounded statistic lies in (a concordance: 0 to 1); its t-interval is clipped to it and the
        results say so (`analysis.summarise`). None: unbounded."""
        return None

    def provenance(self) -> dict[str, Any]:
        """Extra top-level keys of the results (the commit of the analysed runs, notes)."""
        return {}

    def plan_fields(self) -> dict[str, Any]:
        """The plan's fields beyond what the experiment declares (`reanalysis`, `runs_commit`, `notes`)."""
        return {}

    def plan(self, **fields: Any) -> Plan:
        return Plan(
            experiment=self.name,
            version=self.version,
            unit_kind=self.unit_kind,
            units=self.units(),
            runs_per_unit=self.runs_per_unit(),
            primaries=self.primaries(),
            selection=self.selection_rules(),
            settings=dataclasses.asdict(self.settings),
            **fields,
        )
