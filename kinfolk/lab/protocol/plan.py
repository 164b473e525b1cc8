"""An experiment version's plan: committed before its runs, and named by the SHA-256 of its committed bytes.

A plan (`docs/results/<experiment>.plan.json`) fixes what a result may depend on before any result is seen: the
units and runs per unit, the grids, the selection rules and at most `MAX_PRIMARIES` primary endpoints (name, what
is compared with what, the baseline, the direction that favours the method, the value the statistic takes with no
effect). Every result carries `plan_sha256`; the runner refuses to write primary results for runs that were
started under another plan (`PlanMismatch`). Changing a plan makes a new version: its hash changes, and the old
version's results stay as they were.

>>> endpoint = PrimaryEndpoint("gain", "accuracy, method minus uniform", baseline="uniform", direction="higher")
>>> endpoint.favours(0.2), endpoint.favours(-0.1)
(True, False)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kinfolk.atomic import atomic_file
from kinfolk.errors import InputError

MAX_PRIMARIES = 6
PLAN_SCHEMA = 1


class PlanMismatch(InputError):
    """Results were about to be written for runs started under another plan (or a plan that is not the committed
    file)."""


class PlanError(InputError):
    """A plan breaks the protocol (too many primaries, a primary without a baseline, a duplicate name)."""


@dataclass(frozen=True)
class PrimaryEndpoint:
    """One declared primary endpoint. `null` is the value of the per-unit statistic when there is no effect: 0 for
    a paired difference, whatever the design gives for a statistic such as a rank concordance."""

    name: str
    description: str
    baseline: str
    direction: Literal["higher", "lower"]
    null: float = 0.0

    def __post_init__(self) -> None:
        if self.direction not in ("higher", "lower"):
            raise PlanError(f"endpoint {self.name!r}: direction must be 'higher' or 'lower', got {self.direction!r}")

    def favours(self, value: float) -> bool:
        """Whether a unit's value favours the method over the baseline."""
        return value > self.null if self.direction == "higher" else value < self.null


@dataclass(frozen=True)
class Plan:
    """A plan as committed: the experiment, its version, units and runs, settings and selection rules (free-form
    but fixed), primary endpoints, and, for a re-analysis, the commit of the runs it analyses."""

    experiment: str
    version: str
    unit_kind: Literal["family", "seed"]
    units: list[int]
    runs_per_unit: int
    primaries: list[PrimaryEndpoint]
    selection: dict[str, str]
    settings: dict[str, Any] = field(default_factory=dict)
    reanalysis: bool = False
    runs_commit: str | None = None
    notes: list[str] = field(default_factory=list)
    schema: int = PLAN_SCHEMA

    def __post_init__(self) -> None:
        names = [e.name for e in self.primaries]
        if not 1 <= len(names) <= MAX_PRIMARIES:
            raise PlanError(f"plan {self.experiment} v{self.version}: {len(names)} primaries (1 to {MAX_PRIMARIES})")
        if len(set(names)) != len(names):
            raise PlanError(f"plan {self.experiment} v{self.version}: duplicate primary names")
        if self.reanalysis and not self.runs_commit:
            raise PlanError(f"plan {self.experiment} v{self.version}: a re-analysis names the commit of its runs")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        data["primaries"] = [PrimaryEndpoint(**e) for e in data["primaries"]]
        return cls(**data)


def plan_path(results_dir: str | Path, experiment: str) -> Path:
    return Path(results_dir) / f"{experiment}.plan.json"


def sha256_of(path: str | Path) -> str:
    """The SHA-256 of a file's bytes as they are (the committed plan, not a re-serialisation of it)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_plan(path: str | Path) -> tuple[Plan, str]:
    """The plan at `path` and the SHA-256 of its bytes."""
    path = Path(path)
    try:
        plan = Plan.from_json(path.read_text())
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise PlanError(f"{path}: not a plan ({error})") from None
    return plan, sha256_of(path)


def write_plan(plan: Plan, path: str | Path) -> str:
    """Write a new plan file and return its hash; an existing plan file is never rewritten (a changed plan is a new
    version, under a new version string)."""
    path = Path(path)
    if path.exists():
        if path.read_text() == plan.to_json():
            return sha256_of(path)
        raise PlanMismatch(f"{path} exists with other content: a changed plan is a new version")
    with atomic_file(path) as handle:
        handle.write(plan.to_json())
    return sha256_of(path)
