"""Work plan of a scoring pass: rows sorted by length into chunks, chunks into padded batches under a token budget.

Sorting by length (longest first, so an out-of-memory batch shows up at once) keeps rows of similar length
together, which makes right-padding nearly free. Chunks are the unit of caching and of the split across
processes: chunk k goes to process k mod world_size, so neighbouring (similar-cost) chunks spread evenly and the
plan, hence the cache, does not depend on the number of processes.

>>> plan = chunk_plan([3, 9, 5, 9, 1], chunk_rows=2)
>>> [chunk.tolist() for chunk in plan]
[[1, 3], [2, 0], [4]]
>>> token_budget_batches([1, 3, 2, 0], [3, 9, 5, 9], tokens_per_batch=20)
[[1, 3], [2, 0]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def chunk_plan(lengths: Sequence[int], chunk_rows: int, rows: Sequence[int] | None = None) -> list[np.ndarray]:
    """Row indices (of `rows`, default all) sorted by decreasing length, ties by row, cut every `chunk_rows`."""
    lengths = np.asarray(lengths)
    rows = np.arange(len(lengths)) if rows is None else np.asarray(rows, dtype=np.int64)
    order = rows[np.lexsort((rows, -lengths[rows]))]
    return [order[start : start + chunk_rows] for start in range(0, len(order), chunk_rows)]


def chunks_for_process(n_chunks: int, process_index: int, num_processes: int) -> list[int]:
    return list(range(process_index, n_chunks, num_processes))


def token_budget_batches(rows: Sequence[int], lengths: Sequence[int], tokens_per_batch: int) -> list[list[int]]:
    """Greedy batches of `rows` (already length-sorted) whose padded size, rows × longest, fits the budget.

    A row longer than the budget on its own still forms a batch of one.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for row in rows:
        length = int(lengths[row])
        new_width = max(width, length)
        if current and new_width * (len(current) + 1) > tokens_per_batch:
            batches.append(current)
            current, new_width = [], length
        current.append(int(row))
        width = new_width
    if current:
        batches.append(current)
    return batches
