"""IFD selection before weighting: keep the rows whose instruction helps the response least.

IFD (Li et al., "From Quantity to Quality") = ppl(y|x) / ppl(y), the response's perplexity with the prompt over
its perplexity alone. High IFD means the prompt barely helps: a hard, informative example. IFD ≥ 1 means the
prompt does not help at all (often a mismatched pair), so those rows go first. Superfiltering computes the same
score with a small model, which ranks nearly as well at a fraction of the cost; here that is `ifd_model=
"small_base"`, the default. The paper combines ATLANTIS with the top 5/10/15% by IFD.

>>> import numpy as np
>>> ifd = ifd_scores(np.array([-4.0, -9.0, -2.0]), np.array([2, 3, 2]), np.array([-6.0, -9.0, -2.2]),
...                  np.array([2, 3, 2]))
>>> [round(float(x), 3) for x in ifd]
[0.368, 1.0, 0.905]
>>> select_top_fraction(ifd, 0.3).tolist()
[2]
"""

from __future__ import annotations

import math

import numpy as np
from datasets import Dataset

from kinfolk.tokens import DatasetFormatError, dataset_type


def ifd_scores(
    conditional_logprob: np.ndarray,
    conditional_tokens: np.ndarray,
    response_logprob: np.ndarray,
    response_tokens: np.ndarray,
) -> np.ndarray:
    """ppl(y|x) / ppl(y) from the summed log-probs and token counts of both passes, computed in log space."""
    conditional = np.asarray(conditional_logprob, dtype=np.float64) / np.asarray(conditional_tokens)
    alone = np.asarray(response_logprob, dtype=np.float64) / np.asarray(response_tokens)
    return np.exp(alone - conditional)


def select_top_fraction(ifd: np.ndarray, fraction: float, drop_at_least_one: bool = True) -> np.ndarray:
    """Rows (in dataset order) with the highest finite IFD: ceil(fraction · N) of them, among IFD < 1 by default."""
    ifd = np.asarray(ifd, dtype=np.float64)
    eligible = np.isfinite(ifd) & ((ifd < 1.0) if drop_at_least_one else True)
    candidates = np.flatnonzero(eligible)
    keep = min(math.ceil(fraction * len(ifd)), candidates.size)
    ranked = candidates[np.argsort(-ifd[candidates], kind="mergesort")]
    return np.sort(ranked[:keep])


def _prompt_removed(example: dict) -> dict:
    if "messages" in example:
        return {"messages": [m for m in example["messages"] if m["role"] == "assistant"]}
    prompt = example["prompt"]
    return {"prompt": "" if isinstance(prompt, str) else []}


def response_only_dataset(dataset: Dataset) -> Dataset:
    """The same rows with the prompt removed: an empty prompt, or only the assistant turns of a conversation.

    Scored like any dataset, it gives log p(y); as in IFD and Superfiltering, the response's first token has no
    context and goes unscored unless the tokenizer adds a BOS token.
    """
    kind = dataset_type(dataset.column_names)
    if kind == "language modeling" or "conversations" in dataset.column_names:
        raise DatasetFormatError(
            f"IFD needs a prompt to remove: use prompt/completion or messages data (columns {dataset.column_names})"
        )
    columns = ["messages"] if "messages" in dataset.column_names else ["prompt"]
    return dataset.map(_prompt_removed, desc="Removing prompts for IFD", remove_columns=columns)
