"""Running a lab experiment over families, the protocol's unit of replication (`docs/protocol.md`).

An experiment declares its endpoints (`Endpoint`: a name, whether it is primary, its baseline, its direction and
how to read its per-run values from one family's record) before anything runs, then `run_families` builds (or
loads) each family, calls the experiment's `run_family(family, work_dir)` and keeps that family's record in
`out/families/<seed>.json` as soon as it is done, so a stopped experiment resumes at the next family.

The summary follows the protocol: per endpoint, the per-family values (the mean over that family's runs of the
paired differences), their mean, a t-interval with F − 1 degrees of freedom, a two-stage cluster bootstrap
(families, then runs) as the cross-check, and the sign count; with fewer than 5 families the values are reported
without any interval. A value can be undefined in a family (None or NaN: a front that never reaches a level, a run
that could not be trained): that family's value is null, `undefined_families` counts them, the mean and sign count
are over the others, and there is no interval (an interval over the families that happened to reach a level would be
conditional on reaching it). `results.json` carries exactly the fields `docs/results/<experiment>.json` needs.

>>> endpoint = Endpoint("gain", "accuracy minus uniform", lambda record: record["gain"], baseline="uniform")
>>> summary = summarise_endpoint(endpoint, [[0.2, 0.22], [0.25], [0.19], [0.30], [0.22]])
>>> summary["per_family"], summary["favours_method"], summary["ci_method"]
([0.21, 0.25, 0.19, 0.3, 0.22], 5, 't')
>>> summarise_endpoint(endpoint, [[0.2], [0.3]])["ci95"] is None  # two families: values only
True
>>> partial = summarise_endpoint(endpoint, [[0.2], [None], [0.1], [0.3], [0.2]])
>>> partial["per_family"][:2], partial["undefined_families"], partial["mean"], partial["ci95"]
([0.2, None], 1, 0.2, None)
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk import console
from kinfolk.atomic import check_destination, write_json
from kinfolk.lab.world.family import Family, LabConfig, build_family
from kinfolk.stats import MIN_INTERVAL_UNITS, cluster_bootstrap_interval, sign_count, t_interval

FAMILIES_DIR = "families"
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class Endpoint:
    """A declared endpoint: `value(record)` gives its per-run values in one family's record.

    For a comparison the values are paired differences (method − `baseline`, same family, same problems);
    `higher_is_better` says which sign favours the method."""

    name: str
    description: str
    value: Callable[[dict[str, Any]], Sequence[float]]
    baseline: str | None = None
    primary: bool = False
    higher_is_better: bool = True


def _rounded(value: float, digits: int = 6) -> float:
    return float(round(value, digits))


def _defined(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def summarise_endpoint(endpoint: Endpoint, runs_per_family: Sequence[Sequence[float | None]]) -> dict[str, Any]:
    """The protocol's summary of one endpoint from its per-run values in each family (a family with an undefined
    run has no value)."""
    per_family = [float(np.mean(runs)) if runs and all(map(_defined, runs)) else None for runs in runs_per_family]
    defined = [v for v in per_family if v is not None]
    entry: dict[str, Any] = {
        "primary": endpoint.primary,
        "description": endpoint.description,
        "baseline": endpoint.baseline,
        "higher_is_better": endpoint.higher_is_better,
        "per_family": [_rounded(v) if v is not None else None for v in per_family],
        "per_run": [[_rounded(float(v)) if _defined(v) else None for v in runs] for runs in runs_per_family],
        "mean": _rounded(float(np.mean(defined))) if defined else None,
        "favours_method": sign_count(defined, endpoint.higher_is_better),
        "undefined_families": len(per_family) - len(defined),
        "ci95": None,
        "ci_method": "t",
    }
    if len(per_family) >= MIN_INTERVAL_UNITS and len(defined) == len(per_family):
        interval = t_interval(entry["per_family"])
        entry["ci95"] = [_rounded(interval.low), _rounded(interval.high)]
        cluster = cluster_bootstrap_interval(runs_per_family)
        entry["cluster_bootstrap95"] = [_rounded(cluster.low), _rounded(cluster.high)]
    return entry


def settings_key(settings: dict[str, Any]) -> str:
    """A short hash of an experiment's settings: a family record is reused only under the same settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_families(
    experiment: str,
    out: str | Path,
    family_seeds: Sequence[int],
    family_config: Callable[[int], LabConfig],
    run_family: Callable[[Family, Path], dict[str, Any]],
    endpoints: Sequence[Endpoint],
    settings: dict[str, Any],
    *,
    cache_dir: str | Path | None = None,
    allow_failed_family: bool = False,
    overwrite: bool = False,
    resume: bool = True,
    progress: bool = True,
    summary: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run `run_family` on the family of every seed and summarise the declared `endpoints` over families.

    `out/families/<seed>.json` holds each finished family's record (with the settings' hash, so a rerun with other
    settings does not mix them in); `run_family` gets `out/families/<seed>/` for its own partial work. With
    `resume` an existing `out` is continued, otherwise it must be new (or `overwrite`). `summary(records)` adds
    the experiment's own keys to the results (e.g. the data of its figures)."""
    from kinfolk import __version__

    out = Path(out)
    if not (resume and out.exists()):
        out = check_destination(out, overwrite)
    (out / FAMILIES_DIR).mkdir(parents=True, exist_ok=True)
    key = settings_key(settings)
    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    done = [seed for seed in family_seeds if _record_key(out / FAMILIES_DIR / f"{seed}.json") == key]
    if done:
        _say(experiment, f"resuming: {len(done)} of {len(family_seeds)} families done earlier in {out}", progress)
    for seed in family_seeds:
        record_file = out / FAMILIES_DIR / f"{seed}.json"
        if record_file.exists():
            record = json.loads(record_file.read_text())
            if record.get("settings_key") == key:
                records.append(record)
                _say(experiment, f"family {seed}: done earlier, read from {record_file}", progress)
                continue
        _say(experiment, f"family {seed}: building or loading", progress)
        family = build_family(
            family_config(seed), cache_dir=cache_dir, progress=progress, allow_failed=allow_failed_family
        )
        family_start = time.perf_counter()
        record = run_family(family, out / FAMILIES_DIR / str(seed))
        record.update(
            {
                "family_seed": seed,
                "family_key": family.root.name,
                "family_passed": family.passed,
                "family_checks": family.checks,
                "settings_key": key,
                "seconds": round(time.perf_counter() - family_start, 1),
            }
        )
        write_json(record_file, record)
        records.append(record)
    below = [r["family_seed"] for r in records if not r["family_passed"]]
    results = {
        "experiment": experiment,
        "command": "kinfolk " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])
        if Path(sys.argv[0]).name == "kinfolk"
        else None,
        "version": __version__,
        "families": [r["family_seed"] for r in records],
        "families_below_threshold": below,
        "threshold_pass_rate": _rounded(1 - len(below) / len(records)) if records else None,
        "threshold_margins": threshold_margins(records),
        "settings": settings,
        "endpoints": {e.name: summarise_endpoint(e, [list(e.value(r)) for r in records]) for e in endpoints},
        "seconds": round(time.perf_counter() - start, 1),
        "seconds_per_family": {str(r["family_seed"]): r["seconds"] for r in records},
    }
    if summary is not None:
        results.update(summary(records))
    write_json(out / RESULTS_FILE, results)
    return results


def threshold_margins(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per family build check ("model skill metric"), each family's margin over its threshold (negative: missed).

    >>> threshold_margins([{"family_checks": [{"model": "m", "skill": "s", "metric": "acc", "margin": 0.2}]}])
    {'m s acc': [0.2]}
    """
    margins: dict[str, list[float]] = {}
    for record in records:
        for check in record["family_checks"]:
            margins.setdefault(f"{check['model']} {check['skill']} {check['metric']}", []).append(check["margin"])
    return margins


def _say(experiment: str, message: str, progress: bool) -> None:
    if progress:
        console.stage(message, f"kinfolk lab experiment {experiment}")


def _record_key(record_file: Path) -> str | None:
    """The settings key of a finished family's record (None where there is none)."""
    return json.loads(record_file.read_text()).get("settings_key") if record_file.exists() else None


def cached_json(path: Path, compute: Callable[[], Any]) -> Any:
    """`compute()`'s JSON result, kept at `path` (atomically) so a stopped family resumes where it was."""
    if path.exists():
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, value)
    return value
