"""Typed per-unit records: what one run of one unit contributes to an experiment's endpoints, as versioned JSON.

A `RunRecord` is written by the runner as soon as a run is analysed (one file per unit and run), so a stopped
experiment resumes at its next run. It names the plan it was made under; results are only summarised from records
of the current plan.

>>> record = RunRecord("toy", unit=0, run=0, plan_sha256="ab", selection={"temperature": 1.0},
...                    values={"gain": EndpointValue(0.2, method=0.7, baseline=0.5)})
>>> RunRecord.from_dict(record.to_dict()) == record
True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

RECORD_SCHEMA = 1


class RecordSchemaError(ValueError):
    """A record file of another schema version (or not a record)."""


@dataclass(frozen=True)
class EndpointValue:
    """One run's value of one endpoint (None: undefined in this run), the absolute values behind a comparison
    (`method`, `baseline`; for a log-ratio, the two values before the log) and whether anything selected for it lay
    on the edge of its grid."""

    value: float | None
    method: float | None = None
    baseline: float | None = None
    grid_edge: bool = False

    @property
    def defined(self) -> bool:
        return self.value is not None and math.isfinite(self.value)


@dataclass(frozen=True)
class RunRecord:
    """A unit's run: the choices its selection stage made (from validation views only) and its endpoint values."""

    experiment: str
    unit: int
    run: int
    plan_sha256: str
    selection: dict[str, Any]
    values: dict[str, EndpointValue]
    schema: int = RECORD_SCHEMA
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        if data.get("schema") != RECORD_SCHEMA:
            raise RecordSchemaError(f"record schema {data.get('schema')!r}, expected {RECORD_SCHEMA}")
        values = {name: EndpointValue(**value) for name, value in data["values"].items()}
        return cls(**{**data, "values": values})
