"""What may be said of each primary endpoint: its plan's `Claim`, or for a plan written before claims existed, the
claim in a committed addendum that says it was written after the results.

A plan of schema 2 fixes each primary's sentences before any run (`plan.Claim`). Plans committed earlier are hashed
and stay as they are; their sentences live beside them in `<experiment>.claims-addendum.json`, which names the
plan's SHA-256 and is marked `"written": "after the results"`, so nobody mistakes it for pre-registration.
`fixed_claims` finds each primary's claim (from the plan, else the addendum) and `claim_problems` says what is
missing, which `kinfolk lab check` reports. An addendum may also state the range of a bounded statistic whose
results kept none (`"ranges"`: a concordance lies in [0, 1]); `with_stated_ranges` gives the results as the pages show
them, each such interval clipped to its range and flagged, the committed file unchanged. `results_paths` lists a folder's results files, leaving out the plans
and addenda that lie beside them.

>>> import json, tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> claim = {"scope": "in the lab", "if_shown": "It helps in the lab.", "if_not_shown": "Not shown in the lab.",
...          "if_reversed": "It hurts in the lab."}
>>> _ = (folder / "demo.claims-addendum.json").write_text(json.dumps({"experiment": "demo", "version": "1",
...     "plan_sha256": "ab", "written": AFTER_RESULTS, "claims": {"gain": claim}}))
>>> gain = {"primary": True, "mean": -0.2, "null": 0.0, "direction": "higher", "survives_holm": True}
>>> results = {"experiment": "demo", "version": "1", "plan_sha256": "ab", "endpoints": {"gain": gain}}
>>> fixed = fixed_claims(results, folder)["gain"]
>>> fixed.said(gain), fixed.before_results
('It hurts in the lab.', False)
>>> for problem in claim_problems(results | {"endpoints": {"loss": {"primary": True}}}, folder):
...     print(problem)
primary endpoint 'loss' has no claim sentences (neither in its plan nor in demo.claims-addendum.json)
a claim for 'gain', which is not a primary endpoint
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinfolk.lab.protocol.plan import Claim, PlanError, load_plan, plan_path

ADDENDUM_SUFFIX = ".claims-addendum.json"
AFTER_RESULTS = "after the results"
SIDE_FILE_SUFFIXES = (".plan.json", ADDENDUM_SUFFIX)  # files beside the results that are not results


def results_paths(results_dir: str | Path) -> list[Path]:
    """The results files directly in `results_dir` (`<experiment>.json`), without plans and addenda."""
    return sorted(p for p in Path(results_dir).glob("*.json") if not p.name.endswith(SIDE_FILE_SUFFIXES))


def addendum_path(results_dir: str | Path, experiment: str) -> Path:
    return Path(results_dir) / f"{experiment}{ADDENDUM_SUFFIX}"


@dataclass(frozen=True)
class FixedClaim:
    """A primary's claim and when it was fixed: in the plan, before the results (True), or in an addendum, after."""

    claim: Claim
    before_results: bool

    def said(self, entry: dict[str, Any]) -> str:
        """The sentence for a results entry's outcome (whether it survives Holm, and on which side its mean lies)."""
        mean, null = entry["mean"], entry.get("null", 0.0)
        favours = mean is not None and (mean > null if entry.get("direction", "higher") == "higher" else mean < null)
        return self.claim.sentence(bool(entry.get("survives_holm")), favours)


def _plan_claims(results: dict[str, Any], results_dir: Path) -> dict[str, Claim]:
    """The claims of the committed plan the results name (none where the plan has none or is not that plan)."""
    path = plan_path(results_dir, results["experiment"])
    if not path.is_file():
        return {}
    try:
        plan, digest = load_plan(path)
    except PlanError:
        return {}
    if digest != results.get("plan_sha256"):
        return {}
    return {e.name: e.claim for e in plan.primaries if e.claim is not None}


def load_addendum(results: dict[str, Any], results_dir: Path) -> tuple[dict[str, Claim], list[str]]:
    """The addendum's claims for these results, and what is wrong with the addendum (it names another plan, it is
    not marked as written after the results, a claim is malformed)."""
    path = addendum_path(results_dir, results["experiment"])
    if not path.is_file():
        return {}, []
    try:
        data = json.loads(path.read_text())
        claims = {name: Claim(**claim) for name, claim in data["claims"].items()}
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError, PlanError) as error:
        return {}, [f"{path.name}: not a claims addendum ({error})"]
    problems = [
        f"{path.name}: {key!r} is {data.get(key)!r}, the results' is {results.get(key)!r}"
        for key in ("experiment", "version", "plan_sha256")
        if data.get(key) != results.get(key)
    ]
    if data.get("written") != AFTER_RESULTS:
        problems.append(f"{path.name}: 'written' is {data.get('written')!r}, an addendum says {AFTER_RESULTS!r}")
    return ({}, problems) if problems else (claims, [])


def fixed_claims(results: dict[str, Any], results_dir: str | Path) -> dict[str, FixedClaim]:
    """Each primary's claim: the plan's where it has one, else the addendum's (marked as after the results)."""
    results_dir = Path(results_dir)
    planned = _plan_claims(results, results_dir)
    added, _ = load_addendum(results, results_dir)
    found = {name: FixedClaim(claim, before_results=False) for name, claim in added.items()}
    return found | {name: FixedClaim(claim, before_results=True) for name, claim in planned.items()}


def with_stated_ranges(results: dict[str, Any], results_dir: str | Path) -> dict[str, Any]:
    """`results` with each endpoint whose addendum states a range (and whose results state none) bounded to it as
    `analysis.summarise` bounds one: `range`, `ci95_unclipped`, `ci95_clipped` and the clipped `ci95` (a copy).

    >>> import json, tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "c.claims-addendum.json").write_text(json.dumps({"experiment": "c", "version": "1",
    ...     "plan_sha256": "ab", "written": AFTER_RESULTS, "claims": {}, "ranges": {"conc": [0.0, 1.0]}}))
    >>> results = {"experiment": "c", "version": "1", "plan_sha256": "ab", "endpoints": {"conc": {"ci95": [0.8, 1.07]}}}
    >>> bounded = with_stated_ranges(results, folder)["endpoints"]["conc"]
    >>> bounded["ci95"], bounded["ci95_clipped"], results["endpoints"]["conc"]["ci95"]
    ([0.8, 1.0], True, [0.8, 1.07])
    """
    path = addendum_path(results_dir, results["experiment"])
    if not path.is_file() or load_addendum(results, Path(results_dir))[1]:
        return results
    ranges = json.loads(path.read_text()).get("ranges", {})
    endpoints = dict(results["endpoints"])
    for name, (low, high) in ranges.items():
        entry = endpoints.get(name)
        if entry is None or entry.get("range") is not None:
            continue
        interval = entry.get("ci95")
        clipped = None if interval is None else [float(min(max(end, low), high)) for end in interval]
        endpoints[name] = entry | {"range": [float(low), float(high)], "ci95_unclipped": interval,
                                   "ci95": clipped, "ci95_clipped": clipped != interval}  # fmt: skip
    return results | {"endpoints": endpoints}


def claim_problems(results: dict[str, Any], results_dir: str | Path) -> list[str]:
    """Why the results' primaries do not all have claim sentences (empty: they do)."""
    results_dir = Path(results_dir)
    _, problems = load_addendum(results, results_dir)
    claims = fixed_claims(results, results_dir)
    primaries = [name for name, entry in results["endpoints"].items() if entry.get("primary") is True]
    where = f"neither in its plan nor in {results['experiment']}{ADDENDUM_SUFFIX}"
    problems += [
        f"primary endpoint {name!r} has no claim sentences ({where})" for name in primaries if name not in claims
    ]
    problems += [f"a claim for {name!r}, which is not a primary endpoint" for name in claims if name not in primaries]
    return problems
