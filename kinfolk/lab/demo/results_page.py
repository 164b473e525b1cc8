"""The lab's results as markdown, generated from the results JSON (`docs/results/<experiment>.json`), never typed.

`docs/results.md` holds the prose; each experiment's tables sit between `<!-- results:<name> -->` and
`<!-- /results:<name> -->` and are generated from the JSON by `page_with_results`, so the page and the data cannot
disagree (a test checks it); the repository tool `tools/results_page.py` (`make results-page`) writes them into a
checkout, with each experiment's figure of its primary endpoints and the README's evidence table. Each protocol
experiment's block opens with its "in brief" lines: per primary, the sentence its claim fixes for the outcome
(`kinfolk.lab.protocol.sentences`) and the numbers behind it. The page's "what is known now" blocks
(`<!-- known:<question> -->`, the question's slug) hold the same lines and primaries table for each question's newest
version only.
`stale_generated` names a checkout's generated files that its committed results no longer give (`kinfolk lab
check` fails on them).

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

from kinfolk.lab.demo.evidence import (
    CARRIED,
    PLURALS,
    QUESTIONS,
    README,
    RESULTS_DIR,
    carried_rows,
    newest_experiments,
    readme_with_evidence,
)
from kinfolk.lab.protocol.sentences import fixed_claims, with_stated_ranges

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


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def protocol_table(results: dict[str, Any], primary: bool) -> str:
    """A protocol-2 results table: per endpoint its mean, t-interval over units, sign count, and for primaries the
    t-test's p, Holm's p and whether it survives; the grid-edge flag; the per-unit values."""
    rows = []
    for name, entry in results["endpoints"].items():
        if entry["primary"] != primary:
            continue
        values = entry["per_unit"]
        n = sum(v is not None for v in values)
        interval = (
            f"[{_signed(entry['ci95'][0])}, {_signed(entry['ci95'][1])}]"
            if entry["ci95"]
            else f"values only ({n} of {len(values)} units defined)"
        )
        if entry.get("ci95_clipped"):
            interval += f" (clipped to its range [{entry['range'][0]:g}, {entry['range'][1]:g}])"
        row = [f"**{name}**" if primary else name, entry.get("baseline") or "", _signed(entry["mean"]), interval]
        row.append(f"{entry['favours_method']} of {n}" if entry.get("baseline") else "")
        if primary:
            survives = "**yes**" if entry["survives_holm"] else "no"
            row += [_p(entry["p"]), _p(entry["p_holm"]), survives]
        row += ["yes" if entry.get("grid_edge") else "", ", ".join(_signed(v) for v in values)]
        rows.append(row)
    header = ["endpoint", "vs", "mean", "95 % interval (t, units)", "favours"]
    header += ["p", "p (Holm)", "survives Holm"] if primary else []
    return _table([*header, "grid edge", "per unit"], rows)


def in_brief(results: dict[str, Any], results_dir: Path) -> list[str]:
    """Per primary, the sentence its claim fixes for the outcome, then its estimate, interval and Holm p; the lines
    say whether the sentences were fixed in the plan or written after the results."""
    claims = fixed_claims(results, results_dir)
    after = any(not claim.before_results for claim in claims.values())
    lines = [
        "In brief (each primary's sentence for its outcome, "
        + ("written after the results in its claims addendum):" if after else "fixed in the plan before the runs):")
    ]
    for name, entry in results["endpoints"].items():
        if entry["primary"]:
            said = claims[name].said(entry) if name in claims else "(no claim sentence)"
            interval = f" [{_signed(entry['ci95'][0])}, {_signed(entry['ci95'][1])}]" if entry["ci95"] else ""
            lines.append(f"- {said} ({name}: {_signed(entry['mean'])}{interval}, Holm p {_p(entry['p_holm'])})")
    return lines


def protocol_markdown(results: dict[str, Any], results_dir: Path = RESULTS_DIR) -> str:
    """A protocol-2 experiment's summary: provenance, in brief, notes, primaries (with Holm) and the exploratory
    endpoints."""
    units, runs = results["units"], results["runs_per_unit"]
    kind = "re-analysis of the runs committed at " + results["runs_commit"][:10] if results.get("reanalysis") else ""
    primaries = [e for e in results["endpoints"].values() if e["primary"]]
    surviving = sum(bool(e["survives_holm"]) for e in primaries)
    lines = [
        f"Experiment `{results['experiment']}` version {results['version']}"
        + (f" ({kind})" if kind else "")
        + f": {len(units)} {results['unit_kind']} units (seeds {', '.join(map(str, units))}), {runs} run"
        + ("s" if runs != 1 else "")
        + f" per unit; plan `{results['experiment']}.plan.json` (SHA-256 {results['plan_sha256'][:12]}…).",
        "",
        *in_brief(results, results_dir),
        "",
        *[f"- {note}" for note in results.get("notes", [])],
        "",
        *_sections(
            f"Primary endpoints ({len(primaries)}; {surviving} survive Holm's correction at 0.05; per-unit values "
            'are paired differences unless the endpoint says otherwise; "favours" counts units on the method\'s '
            "side of the null):",
            protocol_table(results, primary=True),
            "Exploratory (no test, no claim):",
            protocol_table(results, primary=False),
        ),
    ]
    return "\n".join(lines)


def _sections(*titled: str) -> list[str]:
    """Title, table, title, table, ... as the page's lines (a blank line after each)."""
    return [line for part in titled for line in (part, "")][:-1]


def results_markdown(results: dict[str, Any], results_dir: Path = RESULTS_DIR) -> str:
    """The experiment's summary: families, threshold pass rate, primary and exploratory endpoints (a protocol-2
    result, one with a plan, gets `protocol_markdown`)."""
    if results.get("plan_sha256"):
        return protocol_markdown(with_stated_ranges(results, results_dir), results_dir)
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
        *_sections(
            "Primary endpoints (declared before the runs; per-family values are paired differences):",
            endpoint_table(results, primary=True),
            "Exploratory:",
            endpoint_table(results, primary=False),
        ),
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


def question_slug(question: str) -> str:
    """A question's name in a page marker: "ADAPT, real checkpoint" is `adapt-real-checkpoint`."""
    return re.sub(r"[^a-z0-9]+", "-", question.lower()).strip("-")


def known_markdown(results: dict[str, Any], results_dir: Path = RESULTS_DIR) -> str:
    """What a question's newest version says: where it comes from, its "in brief" lines and its primaries."""
    units = f"{len(results['units'])} {PLURALS.get(results['unit_kind'], results['unit_kind'])}"
    source = f"From `{results['experiment']}` version {results['version']} ({units}), this question's newest version."
    carried = [
        f"- {row.sentence} {row.interval}, Holm: {row.verdict} (`{row.experiment}` version {row.version}, "
        f"{row.endpoint})"
        for row in carried_rows(results, "", results_dir, CARRIED)
    ]
    if carried:
        carried.insert(
            0, "Still standing from earlier versions (parts of the question this version does not ask again):"
        )
        carried.append("")
    results = with_stated_ranges(results, results_dir)
    return "\n".join(
        [source, "", *in_brief(results, results_dir), "", *carried, protocol_table(results, primary=True)]
    )


def page_with_results(text: str, results_dir: Path = RESULTS_DIR) -> str:
    """`text` with every generated block rewritten from `results_dir/<name>.json` (a `known:` block from its
    question's newest version)."""

    def generated(match: re.Match) -> str:
        name = match.group(1)
        results = json.loads((results_dir / f"{name}.json").read_text())
        return f"<!-- results:{name} -->\n{results_markdown(results, results_dir)}\n<!-- /results:{name} -->"

    newest = {question_slug(q): r for q, r in newest_experiments(results_dir, QUESTIONS).items()}

    def known(match: re.Match) -> str:
        slug = match.group(1)
        if slug not in newest:
            raise KeyError(f"<!-- known:{slug} -->: no question with results is called that ({', '.join(newest)})")
        return f"<!-- known:{slug} -->\n{known_markdown(newest[slug], results_dir)}\n<!-- /known:{slug} -->"

    text = re.sub(r"<!-- results:([\w-]+) -->.*?<!-- /results:\1 -->", generated, text, flags=re.DOTALL)
    return re.sub(r"<!-- known:([\w-]+) -->.*?<!-- /known:\1 -->", known, text, flags=re.DOTALL)


def stale_generated(root: Path) -> list[str]:
    """The generated files of the checkout at `root` (README's evidence table, docs/results.md's blocks) that differ
    from what its committed results give; one line each, naming the file and how to regenerate it."""
    stale = []
    for path, regenerate in ((README, readme_with_evidence), (RESULTS_PAGE, page_with_results)):
        if (root / path).is_file():
            text = (root / path).read_text()
            if regenerate(text, root / RESULTS_DIR) != text:
                stale.append(f"{root / path}: its generated part is stale: run python tools/results_page.py")
    return stale
