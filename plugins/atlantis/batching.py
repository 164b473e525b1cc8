"""Work plan of a scoring pass: rows sorted by length into chunks, chunks into padded batches under a token budget.

Sorting by length (longest first, so an out-of-memory batch shows up at once) keeps rows of similar length
together, which makes right-padding nearly free. Chunks are the unit of caching and of the split across
processes: chunk k goes to process k mod world_size, so neighbouring (similar-cost) chunks spread evenly and the
plan, hence the cache, does not depend on the number of processes.

Chunks are cut by padded tokens, not rows, because a chunk is also what an interrupted run loses: by default
each holds about 1/128 of a model's tokens (`chunk_token_budget`), between 1,024 tokens (tiny jobs) and
2,097,152 (so a huge job loses minutes, not hours), so a kill at any point costs each process at most one chunk.

>>> plan = chunk_plan([3, 9, 5, 9, 1], chunk_rows=2)
>>> [chunk.tolist() for chunk in plan]
[[1, 3], [2, 0], [4]]
>>> [chunk.tolist() for chunk in chunk_plan([3, 9, 5, 9, 1], chunk_tokens=18)]  # 2 rows x 9 tokens fit
[[1, 3], [2, 0, 4]]
>>> token_budget_batches([1, 3, 2, 0], [3, 9, 5, 9], tokens_per_batch=20)
[[1, 3], [2, 0]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The default chunk: this share of a model's tokens, within these bounds.
CHUNKS_PER_PASS = 128
MIN_CHUNK_TOKENS = 1024
MAX_CHUNK_TOKENS = 1 << 21


def chunk_token_budget(total_tokens: int, tokens_per_batch: int, chunk_tokens: int | None = None) -> int:
    """Padded tokens per chunk: `chunk_tokens` if set, else 1/`CHUNKS_PER_PASS` of the pass, bounded so a tiny job
    is not cut into slivers and a huge one loses little in absolute time (never below one batch at the top)."""
    if chunk_tokens is not None:
        return chunk_tokens
    share = math.ceil(total_tokens / CHUNKS_PER_PASS)
    return int(min(max(share, MIN_CHUNK_TOKENS), max(MAX_CHUNK_TOKENS, tokens_per_batch)))


def chunk_plan(
    lengths: Sequence[int],
    chunk_rows: int | None = None,
    rows: Sequence[int] | None = None,
    chunk_tokens: int | None = None,
) -> list[np.ndarray]:
    """Row indices (of `rows`, default all) sorted by decreasing length, ties by row, cut into chunks of at most
    `chunk_rows` rows and `chunk_tokens` padded tokens (rows x longest row; a longer row is a chunk of its own)."""
    lengths = np.asarray(lengths)
    rows = np.arange(len(lengths)) if rows is None else np.asarray(rows, dtype=np.int64)
    order = rows[np.lexsort((rows, -lengths[rows]))]
    max_rows = chunk_rows or len(order) or 1
    chunks, start = [], 0
    while start < len(order):
        width = max(int(lengths[order[start]]), 1)  # the chunk's longest row: rows are in decreasing length
        count = max_rows if chunk_tokens is None else max(1, min(max_rows, chunk_tokens // width))
        chunks.append(order[start : start + count])
        start += count
    return chunks


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
