"""Running a lab experiment over seeds: one family, one result per seed, a summary, `results.json` and `results.md`.

The three experiments (`kinfolk lab experiment atlantis | atlas | adapt`) differ in what one seed runs, how the
seeds are summarised and how the summary reads; the bookkeeping around them is this module's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kinfolk.atomic import atomic_file, check_destination, write_json
from kinfolk.errors import InputError
from kinfolk.lab.family import Family, LabConfig, build_family


def seeds_title(name: str, seeds: int) -> str:
    """The results page's heading.

    >>> seeds_title("ADAPT", 1)
    '# ADAPT on the lab: 1 seed'
    """
    return f"# {name} on the lab: {seeds} seed{'s' if seeds != 1 else ''}"


def run_over_seeds(
    name: str,
    out: str | Path,
    seeds: int,
    family_config: LabConfig,
    settings: dict[str, Any],
    run_seed: Callable[[Family, int], dict[str, Any]],
    summarise: Callable[[list[dict[str, Any]]], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], list[str]],
    *,
    cache_dir: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Build (or load) the family, call `run_seed(family, seed)` for seeds 0…`seeds`−1, summarise, and write
    `results.json` and `results.md` (the `markdown` sections plus the run time) under `out`."""
    if seeds < 1:  # before the family build, which takes minutes
        raise InputError(f"--seeds must be at least 1, got {seeds}")
    out = check_destination(out, overwrite)
    start = time.perf_counter()
    family = build_family(family_config, cache_dir=cache_dir, progress=progress)
    per_seed = []
    for seed in range(seeds):
        print(f"[kinfolk lab experiment {name}] seed {seed}", flush=True)
        per_seed.append(run_seed(family, seed))
    results = {
        "family": family.root.name,
        "family_seed": family_config.seed,
        "seeds": list(range(seeds)),
        "settings": settings,
        "per_seed": per_seed,
        "summary": summarise(per_seed),
        "seconds": round(time.perf_counter() - start, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    text = "\n\n".join([*markdown(results), f"Time: {results['seconds']} s."]) + "\n"
    with atomic_file(out / "results.md") as handle:
        handle.write(text)
    print(text)
    return results
