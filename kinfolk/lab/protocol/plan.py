"""An experiment version's plan: committed before its runs, and named by the SHA-256 of its committed bytes.

A plan (`docs/results/<experiment>.plan.json`) fixes what a result may depend on before any result is seen: the
units and runs per unit, the grids, the selection rules and at most `MAX_PRIMARIES` primary endpoints (name, what
is compared with what, the baseline, the direction that favours the method, the value the statistic takes with no
effect) and, from plan schema 2 on, each primary's `Claim`: the sentence said if it survives Holm and the one said
if it does not, both naming the scope it was measured in. Every result carries `plan_sha256`; the runner refuses to write primary results for runs that were
started under another plan (`PlanMismatch`). Changing a plan makes a new version: its hash changes, and the old
version's results stay as they were.

>>> endpoint = PrimaryEndpoint("gain", "accuracy, method minus uniform", baseline="uniform", direction="higher")
>>> endpoint.favours(0.2), endpoint.favours(-0.1)
(True, False)
>>> claim = Claim("in 5 families at 50 steps", "Weighting helps in 5 families at 50 steps.",
...               "Weighting did not help detectably in 5 families at 50 steps.",
...               "Weighting hurts in 5 families at 50 steps.")
>>> claim.sentence(shown=True, favours=False)
'Weighting hurts in 5 families at 50 steps.'
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
PLAN_SCHEMA = 1  # the schema of plans without claims; a plan whose primaries carry claims is CLAIMS_SCHEMA
CLAIMS_SCHEMA = 2


class PlanMismatch(InputError):
    """Results were about to be written for runs started under another plan (or a plan that is not the committed
    file)."""


class PlanError(InputError):
    """A plan breaks the protocol (too many primaries, a primary without a baseline, a duplicate name)."""


@dataclass(frozen=True)
class Claim:
    """What may be said of one primary, fixed before its results: `if_shown` where it survives Holm on the method's
    side of the null, `if_reversed` where it survives on the baseline's side (the test is two-sided), and
    `if_not_shown` where it does not survive. `scope` names where it was measured (the budget, the world or model,
    the comparison: "in the lab's families at 50 equal steps", "on SmolLM2-135M-Instruct, 5 seeds") and every
    sentence says it word for word, so no sentence outgrows what was measured."""

    scope: str
    if_shown: str
    if_not_shown: str
    if_reversed: str

    def __post_init__(self) -> None:
        if not self.scope.strip():
            raise PlanError("a claim names its scope (the budget, the world or model it was measured on)")
        for sentence in (self.if_shown, self.if_not_shown, self.if_reversed):
            if self.scope not in sentence:
                raise PlanError(f"claim sentence {sentence!r} does not say its scope {self.scope!r}")

    def sentence(self, shown: bool, favours: bool) -> str:
        """The sentence for an outcome: survived Holm or not, and the estimate on the method's side or not."""
        return (self.if_shown if favours else self.if_reversed) if shown else self.if_not_shown


@dataclass(frozen=True)
class PrimaryEndpoint:
    """One declared primary endpoint. `null` is the value of the per-unit statistic when there is no effect: 0 for
    a paired difference, whatever the design gives for a statistic such as a rank concordance. `claim` is what the
    results page, the README and the demo will say of it (plans before schema 2 have none: their sentences are in
    an addendum written after the results, `kinfolk.lab.protocol.sentences`)."""

    name: str
    description: str
    baseline: str
    direction: Literal["higher", "lower"]
    null: float = 0.0
    claim: Claim | None = None

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
        unclaimed = [e.name for e in self.primaries if e.claim is None]
        if self.schema >= CLAIMS_SCHEMA and unclaimed:
            raise PlanError(f"plan {self.experiment} v{self.version}: primaries {unclaimed} have no claim sentences")

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        for endpoint in data["primaries"]:  # a plan written before claims keeps its bytes, and so its hash
            if endpoint["claim"] is None:
                del endpoint["claim"]
        return json.dumps(data, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        data["primaries"] = [
            PrimaryEndpoint(**(e | {"claim": Claim(**e["claim"]) if e.get("claim") else None}))
            for e in data["primaries"]
        ]
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
