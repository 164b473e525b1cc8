"""Regenerate the lab's generated documents of this checkout from its committed results: the blocks of
`docs/results.md`, each protocol experiment's primaries figure (`docs/results/<name>-primaries.png`) and the README's
evidence table.

A repository tool, not in the wheel: `python tools/results_page.py` (`make results-page`) writes into the checkout it
sits in, whatever the working directory, or under `--root`. The text comes from the installed package
(`kinfolk.lab.demo.results_page.page_with_results`, `kinfolk.lab.demo.evidence.readme_with_evidence`), which
`kinfolk lab check` also uses to fail on a stale page or table.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kinfolk.atomic import atomic_file
from kinfolk.figures import pyplot, save_figure
from kinfolk.lab.demo.evidence import README, RESULTS_DIR, readme_with_evidence
from kinfolk.lab.demo.results_page import RESULTS_PAGE, page_with_results
from kinfolk.lab.protocol.sentences import results_paths
from kinfolk.verdict_words import NOT_SHOWN, SHOWN

REPO = Path(__file__).resolve().parents[1]


def regenerate(path: Path, results_dir: Path, generate: Callable[[str, Path], str]) -> str:
    """Rewrite the generated parts of the file at `path` (`generate(text, results_dir)`), atomically and only
    where they changed; returns the new text."""
    text = path.read_text()
    updated = generate(text, results_dir)
    if updated != text:
        with atomic_file(path) as handle:
            handle.write(updated)
    return updated


def plot_primaries(results: dict[str, Any], path: str | Path) -> Path:
    """One row per primary endpoint: each unit's value (dots), the mean and its 95 % t-interval (bar), the null
    (dashed); the endpoints that survive Holm are marked."""
    primaries = [(n, e) for n, e in results["endpoints"].items() if e["primary"]]
    figure, axes = pyplot().subplots(len(primaries), 1, figsize=(7.5, 1.1 * len(primaries) + 0.6), squeeze=False)
    for axis, (name, entry) in zip(axes[:, 0], primaries):
        values = [v for v in entry["per_unit"] if v is not None]
        axis.scatter(values, [0] * len(values), s=14, color="0.4", zorder=3)
        if entry["ci95"]:
            axis.errorbar([entry["mean"]], [0], xerr=[[entry["mean"] - entry["ci95"][0]], [entry["ci95"][1] -
                          entry["mean"]]], fmt="o", color="C3" if entry["survives_holm"] else "C0", capsize=4)  # fmt: skip
        axis.axvline(entry.get("null", 0.0), color="0.5", linestyle="--", linewidth=0.8)
        mark = f" ({SHOWN}: survives Holm)" if entry["survives_holm"] else f" ({NOT_SHOWN} after Holm's correction)"
        axis.set_title(name + mark, fontsize=8, loc="left")
        axis.set_yticks([])
        axis.tick_params(labelsize=7)
    return save_figure(figure, path)


def update_figures(results_dir: Path) -> list[Path]:
    """Redraw every protocol-2 result's primaries figure from its JSON."""
    written = []
    for path in results_paths(results_dir):
        results = json.loads(path.read_text())
        if results.get("plan_sha256"):
            written.append(plot_primaries(results, results_dir / f"{results['experiment']}-primaries.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to regenerate (default: this one)")
    root = parser.parse_args(argv).root
    regenerate(root / RESULTS_PAGE, root / RESULTS_DIR, page_with_results)
    update_figures(root / RESULTS_DIR)
    regenerate(root / README, root / RESULTS_DIR, readme_with_evidence)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
