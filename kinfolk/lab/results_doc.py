"""The lab's results as markdown, generated from the results JSON (`docs/results/<experiment>.json`), never typed.

`docs/results.md` holds the prose; each experiment's tables sit between `<!-- results:<name> -->` and
`<!-- /results:<name> -->` and are rewritten from the JSON by `update_results_page` (`python -m
kinfolk.lab.results_doc`), so the page and the data cannot disagree (a test checks it).

>>> results = {"experiment": "demo", "families": [0, 1], "endpoints": {"gain": {
...     "primary": True, "baseline": "uniform", "per_family": [0.1, 0.3], "mean": 0.2, "ci95": None,
...     "favours_method": 2, "higher_is_better": True, "description": "accuracy gain"}}}
>>> print(endpoint_table(results))
| endpoint | vs | mean | 95 % interval (t, families) | favours | per family |
|---|---|---|---|---|---|
| **gain** | uniform | +0.200 | values only (2 families) | 2 of 2 | +0.100, +0.300 |
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.atomic import atomic_file

RESULTS_DIR = Path("docs/results")
RESULTS_PAGE = Path("docs/results.md")


def _signed(value: float | None) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:+.3f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def endpoint_table(results: dict[str, Any], primary: bool | None = True) -> str:
    """One row per endpoint (the primary ones in bold; `primary=None` lists all, `False` the exploratory ones)."""
    rows = []
    for name, entry in results["endpoints"].items():
        if primary is not None and entry["primary"] != primary:
            continue
        n = sum(value is not None for value in entry["per_family"])
        undefined = f"; undefined in {entry['undefined_families']}" if entry.get("undefined_families") else ""
        interval = (
            f"[{_signed(entry['ci95'][0])}, {_signed(entry['ci95'][1])}]"
            if entry["ci95"]
            else f"values only ({n} famil{'y' if n == 1 else 'ies'}{undefined})"
        )
        favours = f"{entry['favours_method']} of {n}" if entry.get("baseline") else ""
        rows.append(
            [
                f"**{name}**" if entry["primary"] else name,
                entry.get("baseline") or "",
                _signed(entry["mean"]),
                interval,
                favours,
                ", ".join(_signed(v) for v in entry["per_family"]),
            ]
        )
    header = ["endpoint", "vs", "mean", "95 % interval (t, families)", "favours", "per family"]
    return _table(header, rows)


def results_markdown(results: dict[str, Any]) -> str:
    """The experiment's summary: families, threshold pass rate, primary and exploratory endpoints."""
    families = results["families"]
    lines = []
    if results.get("families_below_threshold"):
        lines.append(
            f"WARNING: families {results['families_below_threshold']} missed their build thresholds and were used "
            "anyway (--allow-failed-family)."
        )
    lines += [
        f"Experiment `{results['experiment']}`: {len(families)} famil{'y' if len(families) == 1 else 'ies'} "
        f"(seeds {', '.join(map(str, families))}); family build thresholds passed by "
        f"{round((results.get('threshold_pass_rate') or 0) * len(families))} of {len(families)}; "
        f"{_run_time(results)}.",
        "",
        *_margins_line(results),
        "Primary endpoints (declared before the runs; per-family values are paired differences):",
        "",
        endpoint_table(results, primary=True),
        "",
        "Exploratory:",
        "",
        endpoint_table(results, primary=False),
    ]
    return "\n".join(lines)


def _run_time(results: dict[str, Any]) -> str:
    # Families of one experiment may run in separate processes and resume, so the last invocation's wall time can
    # be a summary's seconds; the per-family times are what the runs cost.
    per_family = list((results.get("seconds_per_family") or {}).values())
    if not per_family:
        return f"{results['seconds'] / 60:.0f} min"
    return f"{sum(per_family) / 60:.0f} min of family runs in all (the longest family {max(per_family) / 60:.0f} min)"


def _margins_line(results: dict[str, Any]) -> list[str]:
    margins = results.get("threshold_margins") or {}
    if not margins:
        return []
    smallest = min(margins.items(), key=lambda item: min(item[1]))
    return [
        f"Smallest margin over a build threshold: {min(smallest[1]):+.2f} ({smallest[0]}); every check's margin per "
        "family is in the JSON (`threshold_margins`).",
        "",
    ]


def update_results_page(page: Path = RESULTS_PAGE, results_dir: Path = RESULTS_DIR) -> str:
    """Rewrite every generated block of `page` from `results_dir/<name>.json`; returns the new text."""
    text = page.read_text()

    def generated(match: re.Match) -> str:
        name = match.group(1)
        results = json.loads((results_dir / f"{name}.json").read_text())
        return f"<!-- results:{name} -->\n{results_markdown(results)}\n<!-- /results:{name} -->"

    updated = re.sub(r"<!-- results:([\w-]+) -->.*?<!-- /results:\1 -->", generated, text, flags=re.DOTALL)
    if updated != text:
        with atomic_file(page) as handle:
            handle.write(updated)
    return updated


if __name__ == "__main__":
    update_results_page()
