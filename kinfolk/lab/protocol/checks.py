"""The protocol's rules, checked on a committed results file: `kinfolk lab check` runs them.

`check_results(path)` reads one results JSON and returns a `ResultsCheck` whose `findings` name every rule of
`docs/protocol.md` the file breaks (none: it passes), each as a `Finding` (file, endpoint, rule, message). The
numbers are recomputed with the functions that wrote them (`kinfolk.stats` as `analysis.summarise` and
`analysis.correct` call it), so a recomputed interval, p-value or Holm correction matches to `RELATIVE_TOLERANCE`.

Two kinds of results file are told apart by their keys:

- **protocol results** (`units`, `per_unit`; written by `runner.results`) answer to every rule in `RULES`;
- **protocol-1 results** (`families`, `per_family`; written by version 1's runners, before experiments had plans:
  docs/lab.md names the last commit that holds them) are legacy records, kept only in `docs/results/legacy/`. They answer to the rules that protocol had:
  at least five units, each unit's value the mean of its runs, and intervals that their per-unit values reproduce.
  Their primaries were never capped, tested or corrected, and they have no plan.

`results_files(results_dir)` lists the results files of a checkout: `docs/results/*.json` and
`docs/results/legacy/*.json`, leaving out the plans (`*.plan.json`), the claims addenda (`*.claims-addendum.json`)
and the per-unit records in subfolders.

>>> sorted(RULES)[:4]
['absolute', 'claims', 'exploratory', 'favours']
>>> Finding("docs/results/atlas.json", "gain", "interval", "ci95 is [0.1, 0.3]").line()
"docs/results/atlas.json: endpoint 'gain' breaks interval: ci95 is [0.1, 0.3]"
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kinfolk.errors import InputError
from kinfolk.lab.protocol.analysis import DIGITS, HOLM_LEVEL
from kinfolk.lab.protocol.plan import MAX_PRIMARIES, PlanError, load_plan, plan_path
from kinfolk.lab.protocol.sentences import SIDE_FILE_SUFFIXES, claim_problems, results_paths
from kinfolk.stats import MIN_INTERVAL_UNITS, holm, one_sample_t_p, ratio_allowed, t_interval

RELATIVE_TOLERANCE = 1e-9  # a recomputed interval, p-value or Holm p against the file's (same code, same inputs)
ROUNDING = 10.0**-DIGITS  # the results round every value to DIGITS places: a mean of rounded values may move this much
LEGACY_FOLDER = "legacy"

RULES: dict[str, str] = {
    "format": "a results file: its units, endpoints and each endpoint's fields are there, with the right shapes",
    "units": f"at least {MIN_INTERVAL_UNITS} units",
    "runs-per-unit": "at least two runs per family (a re-analysis keeps its runs' number); one run per seed",
    "unit-values": "each unit's value is the mean of its runs' values (undefined if a run's is)",
    "mean": "the mean is the mean of the defined per-unit values",
    "favours": "favours_method counts the units on the method's side of the null; undefined_units the others",
    "interval": f"ci95 is the t-interval over the per-unit values (U - 1 df), clipped to the statistic's range "
    f"where the entry states one; none from fewer than {MIN_INTERVAL_UNITS} defined units",
    "p-value": "a primary's p is the two-sided one-sample t-test of its per-unit values against its null",
    "holm": f"p_holm is Holm's correction across the tested primaries; survives_holm is p_holm < {HOLM_LEVEL}",
    "primaries": f"1 to {MAX_PRIMARIES} primary endpoints",
    "exploratory": "an exploratory endpoint carries no test and claims nothing",
    "floor": "every entry states its floor (null: not measured); no ratio where a value is within 10x of it",
    "absolute": "every entry holds the absolute values (method, baseline) behind each unit's value",
    "grid-edge": "every entry says whether a choice behind it lay on the edge of its grid",
    "plan-hash": "plan_sha256 is the SHA-256 of the committed <experiment>.plan.json beside the results",
    "plan": "the results' experiment, version, units, runs and primaries are the committed plan's",
    "legacy": "results without a plan (protocol 1) are kept only in docs/results/legacy/",
    "claims": "every primary has its two claim sentences, in its plan or in an addendum marked as written after "
    "the results (kinfolk.lab.protocol.sentences)",
    "generated": "README's evidence table and docs/results.md's generated blocks are the ones the committed results "
    "give (kinfolk.lab.demo.results_page)",
}


@dataclass(frozen=True)
class Finding:
    """One broken rule: in which file, at which endpoint (None: the file as a whole), which rule, and how."""

    file: str
    endpoint: str | None
    rule: str
    message: str

    def line(self) -> str:
        where = f"endpoint {self.endpoint!r} " if self.endpoint is not None else ""
        return f"{self.file}: {where}breaks {self.rule}: {self.message}"


@dataclass(frozen=True)
class ResultsCheck:
    """What checking one file found. `kind` is "protocol", "protocol-1" (legacy) or None (not a results file)."""

    file: str
    kind: Literal["protocol", "protocol-1"] | None
    summary: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.findings

    def lines(self) -> list[str]:
        """One line when the file passes, else one line per finding."""
        return [f"{self.file}: ok ({self.summary})"] if self.passed else [f.line() for f in self.findings]


@dataclass(frozen=True)
class ResultsFormat:
    """Where a kind of results file keeps its units and per-unit values."""

    kind: Literal["protocol", "protocol-1"]
    units: str
    per_unit: str
    undefined: str


PROTOCOL = ResultsFormat("protocol", units="units", per_unit="per_unit", undefined="undefined_units")
PROTOCOL_1 = ResultsFormat("protocol-1", units="families", per_unit="per_family", undefined="undefined_families")


def results_format(data: Any) -> ResultsFormat | None:
    """The kind of results file `data` is, from its keys (None: not a results file)."""
    if not isinstance(data, dict) or not isinstance(data.get("endpoints"), dict):
        return None
    return next((f for f in (PROTOCOL, PROTOCOL_1) if isinstance(data.get(f.units), list)), None)


def results_files(results_dir: str | Path) -> list[Path]:
    """A checkout's results files: `<results_dir>/*.json` and `<results_dir>/legacy/*.json`, without the plans."""
    return sorted([*results_paths(results_dir), *results_paths(Path(results_dir) / LEGACY_FOLDER)])


def _close(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE)


def _rounded(value: float) -> float:
    return float(round(value, DIGITS))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Checker:
    """The findings about one file, gathered rule by rule."""

    def __init__(self, path: Path, data: dict[str, Any], layout: ResultsFormat) -> None:
        self.path, self.data, self.layout = path, data, layout
        self.findings: list[Finding] = []
        self.units: list[Any] = data[layout.units]
        self.endpoints: dict[str, Any] = data["endpoints"]

    def add(self, rule: str, message: str, endpoint: str | None = None) -> None:
        self.findings.append(Finding(str(self.path), endpoint, rule, message))

    # ------------------------------------------------------------------------------------------- the whole file
    def check_units(self) -> None:
        if len(self.units) < MIN_INTERVAL_UNITS:
            self.add("units", f"{len(self.units)} units in {self.layout.units!r}, the protocol asks for at least "
                     f"{MIN_INTERVAL_UNITS}")  # fmt: skip

    def check_runs_per_unit(self) -> None:
        runs, kind = self.data.get("runs_per_unit"), self.data.get("unit_kind")
        if kind not in ("family", "seed") or not isinstance(runs, int) or isinstance(runs, bool):
            self.add(
                "format", f"unit_kind {kind!r} and runs_per_unit {runs!r}: expected 'family' or 'seed' and a count"
            )
        elif kind == "seed" and runs != 1:
            self.add("runs-per-unit", f"{runs} runs per seed: on a real checkpoint a seed is one run")
        elif kind == "family" and runs < (1 if self.data.get("reanalysis") else 2):
            needed = (
                "at least 1 (a re-analysis keeps its runs' number)" if self.data.get("reanalysis") else "at least 2"
            )
            self.add("runs-per-unit", f"{runs} runs per family, the protocol asks for {needed}")

    def check_legacy_location(self) -> None:
        folder = self.path.resolve().parent
        if folder.name == "results" and folder.parent.name == "docs":
            self.add("legacy", f"protocol-1 results (no plan) lie in {folder}, not in its {LEGACY_FOLDER}/ folder")

    def check_plan(self) -> None:
        """The plan hash names the committed plan beside the file, and the results are that plan's."""
        experiment, claimed = self.data.get("experiment"), self.data.get("plan_sha256")
        if not isinstance(experiment, str):
            self.add("format", f"experiment {experiment!r}: the name of the experiment (and of its plan file)")
            return
        plan_file = plan_path(self.path.parent, experiment)
        if not isinstance(claimed, str) or not claimed:
            self.add("plan-hash", f"no plan_sha256: results carry the SHA-256 of their committed plan ({plan_file})")
            return
        if not plan_file.is_file():
            self.add("plan-hash", f"plan_sha256 {claimed[:12]} names a plan, but {plan_file} is not there")
            return
        try:
            plan, actual = load_plan(plan_file)
        except PlanError as error:
            self.add("plan", str(error))
            return
        if claimed != actual:
            self.add("plan-hash", f"plan_sha256 {claimed[:12]} is not the SHA-256 of {plan_file} ({actual[:12]})")
        for name in ("experiment", "version", "unit_kind", "units", "runs_per_unit", "reanalysis", "runs_commit"):
            if self.data.get(name) != getattr(plan, name):
                self.add("plan", f"{name} is {self.data.get(name)!r}, the plan's is {getattr(plan, name)!r}")
        declared = {e.name: e for e in plan.primaries}
        primaries = [name for name, entry in self.endpoints.items() if entry.get("primary") is True]
        if primaries != list(declared):
            self.add("plan", f"primaries {primaries} are not the plan's {list(declared)} (in its order)")
        for name in set(primaries) & set(declared):
            entry, endpoint = self.endpoints[name], declared[name]
            for attribute in ("description", "baseline", "direction", "null"):
                if entry.get(attribute) != getattr(endpoint, attribute):
                    self.add("plan", f"{attribute} is {entry.get(attribute)!r}, the plan's is "
                             f"{getattr(endpoint, attribute)!r}", name)  # fmt: skip

    def check_primaries(self) -> None:
        primaries = [name for name, entry in self.endpoints.items() if entry.get("primary") is True]
        if not 1 <= len(primaries) <= MAX_PRIMARIES:
            self.add("primaries", f"{len(primaries)} primary endpoints, the protocol allows 1 to {MAX_PRIMARIES}")
        for name, entry in self.endpoints.items():
            if entry.get("primary") is not True and any(entry.get(k) is not None for k in ("p", "p_holm")):
                self.add("exploratory", "an exploratory endpoint with a p-value", name)
            if entry.get("primary") is not True and entry.get("survives_holm"):
                self.add("exploratory", "an exploratory endpoint that 'survives' Holm", name)

    def check_holm(self, tested: Mapping[str, float]) -> None:
        """Holm over the primaries with a test, in the file's order; the untested ones claim nothing."""
        adjusted = dict(zip(tested, holm(list(tested.values()))))
        for name, entry in self.endpoints.items():
            if entry.get("primary") is not True:
                continue
            if name not in adjusted:
                if entry.get("p_holm") is not None or entry.get("survives_holm") is not False:
                    self.add("holm", f"untested (no complete interval), yet p_holm {entry.get('p_holm')!r} and "
                             f"survives_holm {entry.get('survives_holm')!r} (expected null and false)", name)  # fmt: skip
                continue
            if not _close(entry.get("p_holm"), adjusted[name]):
                self.add("holm", f"p_holm {entry.get('p_holm')!r}, Holm over the primaries gives {adjusted[name]!r}",
                         name)  # fmt: skip
            if entry.get("survives_holm") is not (adjusted[name] < HOLM_LEVEL):
                self.add("holm", f"survives_holm {entry.get('survives_holm')!r} with a Holm-adjusted p of "
                         f"{adjusted[name]:.4g} (level {HOLM_LEVEL})", name)  # fmt: skip

    # ---------------------------------------------------------------------------------------------- an endpoint
    def per_unit(self, name: str, entry: dict[str, Any]) -> list[float | None] | None:
        """The endpoint's per-unit values (None where undefined), or None after a format finding."""
        values = entry.get(self.layout.per_unit)
        if not isinstance(values, list) or len(values) != len(self.units):
            self.add(
                "format", f"{self.layout.per_unit} is not a list of {len(self.units)} values (one per unit)", name
            )
            return None
        if not all(v is None or _number(v) for v in values):
            self.add("format", f"{self.layout.per_unit} holds a value that is neither a finite number nor null", name)
            return None
        return values

    def check_unit_values(self, name: str, entry: dict[str, Any], per_unit: Sequence[float | None]) -> None:
        runs = entry.get("per_run")
        if not isinstance(runs, list) or len(runs) != len(self.units) or not all(isinstance(r, list) for r in runs):
            self.add("format", f"per_run is not a list of {len(self.units)} lists (each unit's runs)", name)
            return
        expected_runs = self.data.get("runs_per_unit") if self.layout is PROTOCOL else None
        for unit, value, values in zip(self.units, per_unit, runs):
            if expected_runs is not None and len(values) != expected_runs:
                self.add(
                    "runs-per-unit", f"unit {unit} has {len(values)} runs, runs_per_unit is {expected_runs}", name
                )
            elif not values or any(v is None for v in values):
                if value is not None:
                    self.add("unit-values", f"unit {unit} is {value} though a run of it is undefined", name)
            elif not all(_number(v) for v in values):
                self.add("format", f"per_run of unit {unit} holds a value that is not a finite number", name)
            elif value is None or abs(value - sum(values) / len(values)) > ROUNDING:
                self.add("unit-values", f"unit {unit} is {value}, the mean of its runs {values} is "
                         f"{sum(values) / len(values):.{DIGITS}f}", name)  # fmt: skip

    def check_summary(self, name: str, entry: dict[str, Any], per_unit: Sequence[float | None]) -> None:
        """Mean, sign count and undefined count from the per-unit values."""
        defined = [v for v in per_unit if v is not None]
        mean = entry.get("mean")
        if defined and not (_number(mean) and abs(mean - sum(defined) / len(defined)) <= ROUNDING):
            self.add("mean", f"mean {mean!r}, the defined per-unit values average {sum(defined) / len(defined):.6g}",
                     name)  # fmt: skip
        elif not defined and mean is not None:
            self.add("mean", f"mean {mean!r} with no defined unit", name)
        null = entry.get("null", 0.0)
        higher = entry.get("direction", "higher" if entry.get("higher_is_better", True) else "lower") == "higher"
        favours = sum((v > null) if higher else (v < null) for v in defined)
        if entry.get("favours_method") != favours:
            side = "above" if higher else "below"
            self.add("favours", f"favours_method {entry.get('favours_method')!r}, {favours} of the defined units lie "
                     f"{side} the null {null}", name)  # fmt: skip
        if entry.get(self.layout.undefined) != len(per_unit) - len(defined):
            self.add("favours", f"{self.layout.undefined} {entry.get(self.layout.undefined)!r}, "
                     f"{len(per_unit) - len(defined)} units are undefined", name)  # fmt: skip

    def check_interval(self, name: str, entry: dict[str, Any], per_unit: Sequence[float | None]) -> float | None:
        """The t-interval (and, for a primary of protocol results, the t-test) recomputed from the per-unit values;
        returns the recomputed p-value of a tested primary."""
        defined = [v for v in per_unit if v is not None]
        complete = len(defined) == len(per_unit) >= MIN_INTERVAL_UNITS
        ci95, tested = entry.get("ci95"), self.layout is PROTOCOL and entry.get("primary") is True
        if not complete:
            if ci95 is not None:
                self.add("interval", f"a 95 % interval {ci95} from {len(defined)} defined units of {len(per_unit)} "
                         f"(the protocol reports the values, with no interval, below {MIN_INTERVAL_UNITS} or when a "
                         "unit is undefined)", name)  # fmt: skip
            if tested and entry.get("p") is not None:
                self.add("p-value", f"p {entry.get('p')!r} from an incomplete set of units (expected null)", name)
            return None
        if entry.get("ci_method") != "t":
            self.add("interval", f"ci_method {entry.get('ci_method')!r}: the primary interval is a t-interval", name)
        interval = t_interval(defined)
        expected = [_rounded(interval.low), _rounded(interval.high)]
        if entry.get("range") is not None:  # a bounded statistic's interval is clipped to its range
            low, high = entry["range"]
            expected = [min(max(end, low), high) for end in expected]
        if not (isinstance(ci95, list) and len(ci95) == 2 and all(map(_close, ci95, expected))):
            self.add("interval", f"ci95 {ci95!r}, the t-interval over {self.layout.per_unit} ({len(defined) - 1} df) "
                     f"is {expected}", name)  # fmt: skip
        if not tested:
            return None
        p = one_sample_t_p(defined, entry.get("null", 0.0))
        if not _close(entry.get("p"), p):
            self.add("p-value", f"p {entry.get('p')!r}, a t-test of {self.layout.per_unit} against the null "
                     f"{entry.get('null', 0.0)} gives {p!r}", name)  # fmt: skip
        return p

    def check_reporting(self, name: str, entry: dict[str, Any], per_unit: Sequence[float | None]) -> None:
        """Absolute values, floor and grid-edge flag: every entry of protocol results states them."""
        absolute = entry.get("absolute")
        sides = ("method", "baseline")
        if not isinstance(absolute, dict) or not all(
            isinstance(absolute.get(s), list) and len(absolute[s]) == len(self.units) for s in sides
        ):
            self.add("absolute", f"no absolute values: expected {{'method': [...], 'baseline': [...]}} with "
                     f"{len(self.units)} values each", name)  # fmt: skip
            absolute = None
        if not isinstance(entry.get("grid_edge"), bool):
            self.add("grid-edge", f"grid_edge is {entry.get('grid_edge')!r}: expected true or false", name)
        if "floor" not in entry:
            self.add("floor", "no floor: an unmeasured floor is stated as null", name)
            return
        floor = entry["floor"]
        if floor is None:
            return
        if not _number(floor) or floor < 0:
            self.add("floor", f"floor {floor!r} is not a measured value (a non-negative number or null)", name)
            return
        for position, (unit, value) in enumerate(zip(self.units, per_unit)):
            if value is None or absolute is None:
                continue
            method, baseline = absolute["method"][position], absolute["baseline"][position]
            if not (_number(method) and _number(baseline)):
                self.add("floor", f"unit {unit} has a ratio {value} without its two absolute values", name)
            # the absolute values are rounded: a value that rounded down to 10x the floor may have been above it
            elif not ratio_allowed(method + ROUNDING / 2, baseline + ROUNDING / 2, floor):
                self.add("floor", f"unit {unit} has a ratio {value} of {method} and {baseline}, within 10x of the "
                         f"floor {floor:.3g}", name)  # fmt: skip

    def check_endpoints(self) -> None:
        tested: dict[str, float] = {}
        for name, entry in self.endpoints.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("primary"), bool):
                self.add("format", "an endpoint entry is a mapping with a boolean 'primary'", name)
                continue
            per_unit = self.per_unit(name, entry)
            if per_unit is None:
                continue
            self.check_unit_values(name, entry, per_unit)
            self.check_summary(name, entry, per_unit)
            p = self.check_interval(name, entry, per_unit)
            if p is not None:
                tested[name] = p
            if self.layout is PROTOCOL:
                self.check_reporting(name, entry, per_unit)
        if self.layout is PROTOCOL:
            self.check_holm(tested)


def check_results(path: str | Path) -> ResultsCheck:
    """Check one results file against the protocol's rules (see `RULES`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such results file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not JSON ({error})") from None
    layout = results_format(data)
    if layout is None:
        beside = path.name.endswith(SIDE_FILE_SUFFIXES)
        what = "a plan or addendum: check the results file beside it" if beside else "not a results file"
        finding = Finding(
            str(path), None, "format", f"{what} (no 'endpoints' with 'units' or, protocol 1, 'families')"
        )
        return ResultsCheck(str(path), None, "", [finding])
    checker = _Checker(path, data, layout)
    checker.check_units()
    if layout is PROTOCOL:
        checker.check_runs_per_unit()
        checker.check_plan()
        checker.check_primaries()
        if isinstance(data.get("experiment"), str):
            for problem in claim_problems(data, path.parent):
                checker.add("claims", problem)
    else:
        checker.check_legacy_location()
    checker.check_endpoints()
    primaries = sum(entry.get("primary") is True for entry in checker.endpoints.values() if isinstance(entry, dict))
    endpoints = f"{len(checker.endpoints)} endpoints"
    if layout is PROTOCOL:
        unit_kind, runs, plan = data.get("unit_kind"), data.get("runs_per_unit"), str(data.get("plan_sha256"))[:12]
        summary = f"{len(checker.units)} {unit_kind} units, runs_per_unit {runs}, {primaries} primaries, {endpoints}, plan {plan}"
    else:
        summary = f"legacy protocol-1 results: {len(checker.units)} families, {endpoints}; units and intervals checked"
    return ResultsCheck(str(path), layout.kind, summary, checker.findings)
