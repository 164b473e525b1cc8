"""What the lab's evidence shows, generated from the newest version of each question's committed results.

Each question the lab asks has been answered by one or more experiment versions (`QUESTIONS`); a later version
revises the earlier ones, so only the newest is quoted. The README's evidence table (between `<!-- evidence -->`
and `<!-- /evidence -->`, rewritten by `update_readme`) and the demo's headline both take their rows from
`evidence_rows`, never typed: per primary endpoint its mean over units, 95 % t-interval, the two arms' mean
absolute values (`absolute` in the JSON), whether it survives Holm's correction, the experiment and version, and
the sentence its claim fixes for that outcome (`kinfolk.lab.protocol.sentences`: from the plan, or from an addendum
written after the results, which the table marks with a dagger). `superseded_quotes` finds a quoted version that a
newer one has replaced.

>>> version_number("2-reanalysis"), version_number("3")
(2, 3)
>>> row = EvidenceRow("ATLAS", "atlas-controls", "3", "reverse: atlas vs lora", "lora", -0.59, (-1.21, 0.04),
...                   0.0155, 0.028, False, 0.30, 5, "family", "Not shown in the lab's families.", False)
>>> row.line()  # doctest: +NORMALIZE_WHITESPACE
"atlas-controls v3 (5 families): reverse: atlas vs lora -0.590 [-1.210, +0.040] (0.0155 vs 0.028), not shown after
 Holm: Not shown in the lab's families. (sentence written after the results)"
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinfolk.atomic import atomic_file
from kinfolk.lab.protocol.sentences import ADDENDUM_SUFFIX, fixed_claims, results_paths, with_stated_ranges
from kinfolk.verdict_words import NOT_SHOWN, SHOWN

RESULTS_DIR = Path("docs/results")
README = Path("README.md")
PLURALS = {"family": "families", "seed": "seeds"}  # the results' unit kinds
BEGIN, END = "<!-- evidence -->", "<!-- /evidence -->"
AFTER_MARK = "†"  # the table's mark on a sentence written after the results
NO_CLAIM = "(no claim sentence: kinfolk lab check fails)"
# The question each registered experiment answers; a newer version of a question supersedes its older ones.
QUESTIONS: dict[str, str] = {
    "atlantis": "ATLANTIS",
    "atlantis-controls": "ATLANTIS",
    "atlas": "ATLAS",
    "atlas-controls": "ATLAS",
    "adapt": "ADAPT",
    "adapt-controls": "ADAPT",
    "adapt-frontier": "ADAPT",
    "adapt-compute": "ADAPT",
    "real-atlas": "ATLAS, real checkpoint",
    "real-atlas-compare": "ATLAS, real checkpoint",
    "real-boomerang": "ADAPT, real checkpoint",
    "real-boomerang-controls": "ADAPT, real checkpoint",
    "real-boomerang-compute": "ADAPT, real checkpoint",
}


def version_number(version: str) -> int:
    """The version's number ("2-reanalysis" is version 2)."""
    return int(re.match(r"\d+", version).group())


def _mean(values: list[float | None]) -> float | None:
    defined = [value for value in values if value is not None]
    return sum(defined) / len(defined) if defined else None


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.3f}"


@dataclass(frozen=True)
class EvidenceRow:
    """One primary endpoint of a question's newest experiment, as its results JSON gives it."""

    question: str
    experiment: str
    version: str
    endpoint: str
    baseline: str | None
    estimate: float | None
    ci95: tuple[float, float] | None
    method_mean: float | None  # mean over units of the method's absolute value (None: the endpoint has none)
    baseline_mean: float | None
    shown: bool
    p_holm: float | None
    units: int
    unit_kind: str
    claim: str | None  # the sentence its claim fixes for this outcome (None: it has none)
    claim_before_results: bool  # fixed in the plan (True) or in an addendum written after the results

    @property
    def label(self) -> str:
        return f"{self.experiment} v{self.version}"

    @property
    def interval(self) -> str:
        span = f"[{_signed(self.ci95[0])}, {_signed(self.ci95[1])}]" if self.ci95 else "(no interval)"
        return f"{_signed(self.estimate)} {span}"

    @property
    def absolute(self) -> str:
        """The mean absolute values, "method vs baseline" ("" where the endpoint has none, as a concordance)."""
        if self.method_mean is None or self.baseline_mean is None:
            return ""
        return f"{self.method_mean:.3g} vs {self.baseline_mean:.3g}"

    @property
    def verdict(self) -> str:
        return SHOWN if self.shown else NOT_SHOWN

    @property
    def sentence(self) -> str:
        """The claim's sentence, marked where it was written after the results."""
        if self.claim is None:
            return NO_CLAIM
        return self.claim if self.claim_before_results else f"{self.claim} {AFTER_MARK}"

    def line(self) -> str:
        """The row in one line of text (the demo's headline)."""
        absolute = f" ({self.absolute})" if self.absolute else ""
        said = self.claim or NO_CLAIM
        after = "" if self.claim_before_results or self.claim is None else " (sentence written after the results)"
        return (
            f"{self.label} ({self.units} {PLURALS.get(self.unit_kind, self.unit_kind)}): {self.endpoint} "
            f"{self.interval}{absolute}, {self.verdict} after Holm: {said}{after}"
        )


def _rows_of(results: dict[str, Any], question: str, results_dir: Path) -> list[EvidenceRow]:
    rows = []
    claims = fixed_claims(results, results_dir)
    results = with_stated_ranges(results, results_dir)
    for name, entry in results["endpoints"].items():
        if not entry["primary"]:
            continue
        absolute = entry.get("absolute") or {}
        rows.append(
            EvidenceRow(
                question=question,
                experiment=results["experiment"],
                version=results["version"],
                endpoint=name,
                baseline=entry.get("baseline"),
                estimate=entry["mean"],
                ci95=tuple(entry["ci95"]) if entry["ci95"] else None,
                method_mean=_mean(absolute.get("method", [])),
                baseline_mean=_mean(absolute.get("baseline", [])),
                shown=bool(entry["survives_holm"]),
                p_holm=entry.get("p_holm"),
                units=len(results["units"]),
                unit_kind=results["unit_kind"],
                claim=claims[name].said(entry) if name in claims else None,
                claim_before_results=claims[name].before_results if name in claims else False,
            )
        )
    return rows


def committed_results(results_dir: Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    """Every committed experiment's results by name (`results_dir/<name>.json`, plans left out)."""
    found = {}
    for path in results_paths(results_dir):
        results = json.loads(path.read_text())
        found[results["experiment"]] = results
    return found


def newest_experiments(
    results_dir: Path = RESULTS_DIR, questions: dict[str, str] = QUESTIONS
) -> dict[str, dict[str, Any]]:
    """Per question (in `questions`' order), the results of its newest committed version."""
    newest: dict[str, dict[str, Any]] = {}
    for name, results in committed_results(results_dir).items():
        if name not in questions:
            raise KeyError(f"{results_dir / name}.json: experiment {name!r} answers no question in QUESTIONS")
        question = questions[name]
        if question not in newest or version_number(results["version"]) > version_number(newest[question]["version"]):
            newest[question] = results
    order = list(dict.fromkeys(questions.values()))
    return {question: newest[question] for question in order if question in newest}


def evidence_rows(results_dir: Path = RESULTS_DIR, questions: dict[str, str] = QUESTIONS) -> list[EvidenceRow]:
    """Every primary endpoint of each question's newest version, question by question."""
    return [
        row
        for question, results in newest_experiments(results_dir, questions).items()
        for row in _rows_of(results, question, results_dir)
    ]


def evidence_table(rows: list[EvidenceRow]) -> str:
    """The README's table: one row per primary endpoint, its words the sentence its claim fixes for the outcome;
    a line under it says what the dagger means where a row has one."""
    header = [
        "question",
        "what the result says (its scope)",
        "estimate [95 % CI]",
        "method vs baseline",
        "Holm",
        "from",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        verdict = f"**{row.verdict}**" if row.shown else row.verdict
        cells = [row.question, row.sentence, row.interval, row.absolute or "—", verdict, f"`{row.label}`"]
        lines.append("| " + " | ".join(cells) + " |")
    if any(row.claim is not None and not row.claim_before_results for row in rows):
        lines += ["", f"{AFTER_MARK} sentence written after the results (`docs/results/<experiment>{ADDENDUM_SUFFIX}`"
                  "), not fixed in the plan."]  # fmt: skip
    return "\n".join(lines)


def readme_block(results_dir: Path = RESULTS_DIR, questions: dict[str, str] = QUESTIONS) -> str:
    """The README's generated block, markers included."""
    return f"{BEGIN}\n{evidence_table(evidence_rows(results_dir, questions))}\n{END}"


def readme_with_evidence(text: str, results_dir: Path = RESULTS_DIR, name: str = str(README)) -> str:
    """`text` (a README named `name`) with its evidence block generated from the committed results."""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), flags=re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{name}: no {BEGIN} ... {END} block to generate")
    return pattern.sub(lambda _: readme_block(results_dir), text)


def update_readme(readme: Path = README, results_dir: Path = RESULTS_DIR) -> str:
    """Rewrite the README's evidence block from the committed results; returns the new text."""
    text = readme.read_text()
    updated = readme_with_evidence(text, results_dir, str(readme))
    if updated != text:
        with atomic_file(readme) as handle:
            handle.write(updated)
    return updated


def superseded_quotes(text: str, results_dir: Path = RESULTS_DIR, questions: dict[str, str] = QUESTIONS) -> list[str]:
    """The experiment versions `text` quotes ("<name> v<version>") that are not their question's newest."""
    newest = {q: f"{r['experiment']} v{r['version']}" for q, r in newest_experiments(results_dir, questions).items()}
    quoted = re.findall(r"\b([a-z][\w-]*) v(\d[\w-]*)", text)
    return sorted({f"{name} v{version}" for name, version in quoted if name in questions} - set(newest.values()))
