"""Every choice of the real-atlas experiment, made on validation only: the gain levels, each method's checkpoint at
each level, and (in the pilot) each method's learning rate and Output-KL's strength.

A run is a list of checkpoints, each with its validation `gain` (the mean per-token NLL the adapter removes from
held-out code, frozen minus current) and, per retained source, its validation `kl` (KL(frozen ‖ current) per
token). The levels are fractions of LoRA's best validation gain. At a level, a method's checkpoint is, among its
trained checkpoints whose validation gain reaches the level, the one whose retained drift (the geometric mean of
its sources' KLs) is lowest; a method none of whose checkpoints reaches the level has no checkpoint there.

>>> lora = [{"step": 0, "gain": 0.0, "kl": {"a": 1e-9}}, {"step": 12, "gain": 0.2, "kl": {"a": 0.01}},
...         {"step": 24, "gain": 0.4, "kl": {"a": 0.03}}]
>>> levels({"mid": 0.5, "high": 0.75}, lora)
{'mid': 0.2, 'high': 0.3}
>>> checkpoint_at(lora, 0.2), checkpoint_at(lora, 0.5)
(12, None)

Every method's run (LoRA's too) is chosen in the pilot by one rule, `choose_run`: least drift at the pilot's level,
the same fraction of the best gain any LoRA run reaches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Checkpoint = Mapping[str, Any]  # {"step", "gain", "kl": {source: value}} on one split


def drift(point: Checkpoint) -> float:
    """The geometric mean over retained sources of KL(frozen ‖ current) per token (floored at 1e-12 for log 0)."""
    values = list(point["kl"].values())
    return math.exp(sum(math.log(max(value, 1e-12)) for value in values) / len(values))


def best_gain(points: Sequence[Checkpoint]) -> float:
    return max(point["gain"] for point in points if point["step"] > 0)


def levels(fractions: Mapping[str, float], baseline: Sequence[Checkpoint]) -> dict[str, float]:
    """Each named level as a validation gain: its fraction of the baseline's best validation gain."""
    top = best_gain(baseline)
    return {name: round(fraction * top, 10) for name, fraction in fractions.items()}


def checkpoint_at(points: Sequence[Checkpoint], level: float) -> int | None:
    """The step of the lowest-drift trained checkpoint whose gain reaches `level` (None when none does)."""
    reaching = [point for point in points if point["step"] > 0 and point["gain"] >= level]
    return min(reaching, key=lambda point: (drift(point), point["step"]))["step"] if reaching else None


def choose_run(runs: Mapping[str, Sequence[Checkpoint]], level: float) -> str:
    """Among a method's runs (by name), the one whose checkpoint at `level` drifts least; when none reaches the
    level, the one reaching the highest gain."""
    reaching = {name: checkpoint_at(points, level) for name, points in runs.items()}
    candidates = {name: step for name, step in reaching.items() if step is not None}
    if not candidates:
        return max(runs, key=lambda name: (best_gain(runs[name]), name))

    def drift_at(name: str) -> float:
        return drift(next(p for p in runs[name] if p["step"] == candidates[name]))

    return min(candidates, key=lambda name: (drift_at(name), name))


def pilot_level(baseline_runs: Mapping[str, Sequence[Checkpoint]], fraction: float) -> float:
    """The pilot's comparison level: `fraction` of the best validation gain any of the baseline's runs reaches."""
    return round(fraction * max(best_gain(points) for points in baseline_runs.values()), 10)
