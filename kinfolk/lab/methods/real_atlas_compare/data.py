"""Each seed's data folders for `kinfolk compare`: the target (Python code) and three retained sources, drawn per
seed from fixed pools, written as the JSON-lines files a user would give the command.

Pools (all on every machine, `kinfolk.lab.methods.real_corpus` and `make real-models`): the target is the standard
library's top-level modules in chunks; the retained sources are the model's own greedy answers to chat instructions
(`chat`), Shakespeare's Sonnets in halves (`prose`) and the standard library's documentation topics in chunks
(`docs`). Per seed, each source's groups (a module's or topic's chunks, a sonnet's halves: one group never spans
two splits) are shuffled by the seed and dealt out: `held_out` rows to `validation`, `held_out` to `test`, the rest
to `train` (of the target, as many as the runs read; of a retained source, the first `fit_rows` of them: the ATLAS
fit and Output-KL's rows).

The target's rows are `text` rows. The retained sources' rows are prompt/completion rows (one format, so their
training rows are trained on together): a chat row's prompt is the instruction in the chat template and its
completion the model's own answer, so its KL is measured on the answer and its prompt is one whose greedy answer a
run keeps for the churn; a prose or docs row has an empty prompt and the whole text as its completion.

>>> folds = deal({f"m{i}#{j}": "" for i in range(6) for j in range(2)}, seed=3, held_out=2)
>>> {split: len(names) for split, names in folds.items()}
{'validation': 2, 'test': 2, 'train': 8}
>>> {group_of(n) for n in folds["test"]} & {group_of(n) for n in folds["train"]}  # a module never in two splits
set()
>>> halves("line 1\\nline 2\\nline 3\\nline 4")
['line 1\\nline 2', 'line 3\\nline 4']
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from pathlib import Path

from kinfolk.atomic import atomic_directory
from kinfolk.errors import OutputExistsError
from kinfolk.lab.methods.real_corpus import prose_texts

TARGET = "code"
RETAINED = ("chat", "prose", "docs")  # chat first: its prompts are the churn's
SPLITS = ("train", "validation", "test")
DRAWS = 20  # shuffles tried per seed before a pool is called too small


def group_of(name: str) -> str:
    """The group an item belongs to: its name before `#` (a module's chunks, a sonnet's halves)."""
    return name.split("#")[0]


def deal(items: Mapping[str, str], seed: int, held_out: int) -> dict[str, list[str]]:
    """The item names of each split for `seed`: groups shuffled by the seed, the first groups filling `validation`
    up to `held_out` rows, the next `test`, the rest `train` (a group that would overfill a split goes to train).
    Where the groups' sizes leave a split short (seed 1's draw stopped at 63 of 64), the groups are shuffled again
    by the seed and the next draw number until both fill: a seed whose first draw filled keeps it."""
    groups: dict[str, list[str]] = {}
    for name in sorted(items):
        groups.setdefault(group_of(name), []).append(name)
    for draw in range(DRAWS):
        order = sorted(groups)
        random.Random(f"real-atlas-compare-{seed}" + (f"-{draw}" if draw else "")).shuffle(order)
        folds: dict[str, list[str]] = {"validation": [], "test": [], "train": []}
        for group in order:
            for split in ("validation", "test", "train"):
                if split == "train" or len(folds[split]) + len(groups[group]) <= held_out:
                    folds[split] += groups[group]
                    break
        short = [split for split in ("validation", "test") if len(folds[split]) < held_out]
        if not short:
            return folds
    raise ValueError(f"seed {seed}: {len(folds[short[0]])} {short[0]} rows drawn in {DRAWS} draws, {held_out} needed")


def halves(text: str) -> list[str]:
    """A poem's first and second half, by lines (a sonnet: its first seven lines, then the rest)."""
    lines = text.splitlines()
    middle = (len(lines) + 1) // 2
    return ["\n".join(lines[:middle]), "\n".join(lines[middle:])]


def prose_items(path: Path) -> dict[str, str]:
    """The Sonnets in halves, named `sonnet:N#half`."""
    return {f"{name}#{index}": half for name, text in prose_texts(path).items()
            for index, half in enumerate(halves(text))}  # fmt: skip


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def write_seed_data(
    out: Path,
    seed: int,
    pools: Mapping[str, Mapping[str, str]],
    held_out: int,
    fit_rows: int,
    train_rows: int,
    chat_row: Callable[[str], dict],
) -> dict[str, dict[str, list[str]]]:
    """Write `out/<source>/{train,validation,test}.jsonl` for every pool (the target's and the retained ones) and
    return the names drawn, by source and split: the target's first `train_rows` training rows (a run reads no
    more), each retained source's first `fit_rows`. `chat_row(name)` is a chat item's prompt/completion row. Written
    whole or not at all; an existing folder (this seed's, or one another process wrote meanwhile) is kept."""
    drawn = {source: deal(items, seed, held_out) for source, items in pools.items()}
    for source in pools:
        drawn[source]["train"] = drawn[source]["train"][: train_rows if source == TARGET else fit_rows]
    if (out / "drawn.json").is_file():
        return json.loads((out / "drawn.json").read_text())
    try:
        with atomic_directory(out) as staging:
            for source, folds in drawn.items():
                (staging / source).mkdir()
                for split, names in folds.items():
                    if source == TARGET:
                        rows = [{"text": pools[source][name]} for name in names]
                    elif source == "chat":
                        rows = [chat_row(name) for name in names]
                    else:
                        rows = [{"prompt": "", "completion": pools[source][name]} for name in names]
                    write_rows(staging / source / f"{split}.jsonl", rows)
            (staging / "drawn.json").write_text(json.dumps(drawn, indent=1) + "\n")
    except (OutputExistsError, OSError):  # another process wrote the same draw first: theirs stands
        if not (out / "drawn.json").is_file():
            raise
    return json.loads((out / "drawn.json").read_text())
