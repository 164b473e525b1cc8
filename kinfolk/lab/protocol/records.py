"""Typed per-unit records: what one run of one unit contributes to an experiment's endpoints, as versioned JSON.

A `RunRecord` is written by the runner as soon as a run is analysed (one file per unit and run), so a stopped
experiment resumes at its next run. It names the plan it was made under; results are only summarised from records
of the current plan.

An experiment's raw records (what `load_run` makes: one per unit, or per unit and run) are kept at one path
convention, `<records folder>/<key>.json`, the key the experiment's: `<family>/<run>` for family runs,
`<seed>/record` for real-atlas (beside its contexts and adapters), `<seed>` for real-boomerang; `kept_record` reads
one back when it is of the experiment's record version.

>>> record = RunRecord("toy", unit=0, run=0, plan_sha256="ab", selection={"temperature": 1.0},
...                    values={"gain": EndpointValue(0.2, method=0.7, baseline=0.5)})
>>> RunRecord.from_dict(record.to_dict()) == record
True
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
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


def kept_path(records: str | Path, key: str) -> Path:
    """Where the raw record of `key` is kept."""
    return Path(records) / f"{key}.json"


def kept_record(records: str | Path, key: str, version: int) -> dict[str, Any] | None:
    """The raw record kept at `records/<key>.json`, or None when there is none of record version `version`.

    >>> import tempfile
    >>> kept_record(tempfile.mkdtemp(), "0/1", version=1) is None
    True
    """
    path = kept_path(records, key)
    kept = json.loads(path.read_text()) if path.exists() else None
    return kept if kept is not None and kept.get("record_version") == version else None
