"""What a comparison's run logs to its `drift.jsonl`, and its curves read back.

Keys: `target` (the target score) and `retained_kl` on the validation splits; with `--test_split`, `test/target` and
`test/retained_kl` on the test splits. With several retained sources each one's KL is logged under
`retained_kl/<source>` (`test/retained_kl/<source>`), and once the run has trained, `retained_kl` rows holding their
geometric mean (`kinfolk.drift.levels.sources_drift`, the drift) are appended (`append_drift`): `kinfolk drift` reads
any compare run's drift under the one key.

>>> key(KL), key(KL, TEST, "code"), key(TARGET, TEST)
('retained_kl', 'test/retained_kl/code', 'test/target')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kinfolk.drift import Run
from kinfolk.drift.levels import sources_drift
from kinfolk.drift.log import append_row, load_run, read_rows, steps

TARGET, KL, NLL = "target", "retained_kl", "retained_nll"  # NLL: a source's NLL per token (`--retained_nll`)
VALIDATION, TEST = "validation", "test"


def key(name: str, split: str = VALIDATION, source: str | None = None) -> str:
    """The drift.jsonl key of `name` (TARGET or KL) on `split`, for one retained `source` or (None) all of them."""
    return ("" if split == VALIDATION else f"{split}/") + name + ("" if source is None else f"/{source}")


def source_keys(sources: Sequence[str], split: str) -> dict[str, str]:
    """Each source's KL key: one source logs the drift itself, several each their own."""
    return {source: key(KL, split, source if len(sources) > 1 else None) for source in sources}


@dataclass(frozen=True)
class Curves:
    """One run's checkpoints (step, target, drift): on validation, on test (None without a test split), per
    retained source (step, target, that source's KL) on the split the verdicts read, and there each source's NLL per
    token by step (`--retained_nll`; empty without it)."""

    validation: Run
    test: Run | None
    sources: dict[str, Run]
    nll: dict[str, dict[int, float]] = field(default_factory=dict)


def append_drift(folder: Path, sources: Sequence[str], splits: Sequence[str]) -> None:
    """With several sources, the drift rows (`key(KL, split)`: the sources' geometric mean) of every checkpoint."""
    if len(sources) < 2:
        return
    for split in splits:
        keys = source_keys(sources, split)
        for step, row in steps(read_rows(folder)).items():
            if all(name in row for name in keys.values()):
                append_row(folder, {"step": step, key(KL, split): sources_drift(row[k] for k in keys.values())})


def read_curves(method: str, seed: int, folder: Path, sources: Sequence[str], test: bool) -> Curves:
    """A run's curves from its drift.jsonl (see the module)."""
    verdict_split = TEST if test else VALIDATION
    by_source = {
        source: load_run(method, str(seed), folder, key(TARGET, verdict_split), name)
        for source, name in source_keys(sources, verdict_split).items()
    }
    validation = load_run(method, str(seed), folder, key(TARGET), key(KL))
    tested = load_run(method, str(seed), folder, key(TARGET, TEST), key(KL, TEST)) if test else None
    rows = steps(read_rows(folder))
    nll = {source: {step: row[key(NLL, verdict_split, source)] for step, row in rows.items()
                    if key(NLL, verdict_split, source) in row} for source in sources}  # fmt: skip
    return Curves(validation, tested, by_source, {source: steps_ for source, steps_ in nll.items() if steps_})
