"""Each arm's training rows and weights on a scored pool: the formulas, their large-base-only controls, uniform.

`a-only` and `filter` read nothing but a = log p_bL(y|x), the log-prob of the model that is trained. If a formula
that also reads the small models (a − b, a − b + c) beats them, the small models add something beyond the trained
model's own likelihood; if not, the formula's gain is the large base acting as its own verifier.

>>> from datasets import Dataset
>>> scored = Dataset.from_dict({"large_base_logprob": [-1.0, -8.0, -2.0, -6.0], "response_bytes": [2, 2, 2, 2]})
>>> training_rows(scored, "filter", 0.5)  # the top half by a per byte
(array([0, 2]), array([1., 1.]))
>>> rows, weights = training_rows(scored, "a-only", 1.0)
>>> bool(weights[0] > weights[2] > weights[3] > weights[1]), round(float(weights.mean()), 6)
(True, 1.0)
"""

from __future__ import annotations

import numpy as np
from datasets import Dataset

FORMULA_ARMS = ("ratio", "algorithm1")  # weighted by kinfolk.plugins.atlantis.compute_weights
ARMS = ("uniform", *FORMULA_ARMS, "a-only", "filter", "oracle")


def large_base_per_byte(scored: Dataset) -> np.ndarray:
    """a per response byte: the score both large-base-only arms rank rows by."""
    a = np.asarray(scored["large_base_logprob"], dtype=np.float64)
    return a / np.asarray(scored["response_bytes"], dtype=np.float64)


def filtered_rows(scored: Dataset, fraction: float) -> np.ndarray:
    """Indices of the `fraction` of rows with the highest a per byte (ties: the earlier row), in pool order."""
    keep = max(1, round(fraction * len(scored)))
    ranked = np.argsort(-large_base_per_byte(scored), kind="stable")
    return np.sort(ranked[:keep])


def training_rows(scored: Dataset, arm: str, value: float) -> tuple[np.ndarray, np.ndarray]:
    """The rows an arm trains on and their weights (mean 1 over those rows); `value` is the arm's grid value
    (a temperature; the kept fraction for `filter`; unused for `uniform`, whose grid is the learning rate)."""
    from kinfolk.plugins.atlantis import WeightConfig, compute_weights
    from kinfolk.plugins.atlantis.weights import stabilize

    every = np.arange(len(scored))
    if arm == "uniform":
        return every, np.ones(len(scored))
    if arm == "filter":
        rows = filtered_rows(scored, value)
        return rows, np.ones(len(rows))
    if arm == "oracle":
        from kinfolk.lab.methods.atlantis import oracle_weights

        if "good" not in scored["kind"]:
            raise ValueError(
                f"the oracle puts weight only on ideal responses, and none of the {len(scored)} rows is one"
            )
        return every, oracle_weights(scored)
    if arm == "a-only":  # the library's transforms (temperature, 1/99 % quantile clip, self-normalisation) on a alone
        config = WeightConfig(normalization="byte", temperature=value)
        return every, np.exp(stabilize(large_base_per_byte(scored), config).log_weights)
    if arm in FORMULA_ARMS:
        weighted = compute_weights(scored, formula=arm, normalization="byte", temperature=value)
        return every, np.asarray(weighted["weight"], dtype=np.float64)
    raise ValueError(f"unknown arm {arm!r}; arms: {list(ARMS)}")


def verifier_precision(scored: Dataset, fraction: float) -> float:
    """Share of ideal responses (correct, preferred format) among the rows the filter keeps at `fraction`."""
    kinds = np.asarray(scored["kind"])[filtered_rows(scored, fraction)]
    return float(np.mean(kinds == "good"))
