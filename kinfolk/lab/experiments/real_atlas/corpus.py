"""The offline text of a real-atlas run, split per seed so that nothing is both trained on (or fitted on) and
measured.

The target is Python code: the standard library's top-level modules (PSF licence) in chunks, split by module, so
no function is both trained on and measured. The retained behaviour has three sources, none of them code: the
model's own greedy answers to chat instructions (`chat`), English verse (Shakespeare's Sonnets, `prose`) and
technical prose (the standard library's `pydoc_data.topics`, `docs`). Each item's split is a function of its name
and the seed (`split_of`): one in eight is validation, one in eight test, the rest training. A retained source's
training rows fit the atlas and feed Output-KL; its validation rows choose checkpoints; its test rows are reported.

>>> split_of("module:os#3", 0) == split_of("module:os#7", 0)  # chunks follow their module
True
>>> sorted({split_of(f"topic:{i}", 0) for i in range(40)})
['test', 'train', 'validation']
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from kinfolk.lab.methods.real_corpus import chat_instructions, code_texts, doc_texts, prose_texts

SPLIT_SHARE = 8  # one item in eight is validation, one in eight test
RETAINED_SOURCES = ("chat", "prose", "docs")
SPLITS = ("validation", "test")


def split_of(name: str, seed: int) -> str:
    """`train`, `validation` or `test` for the item called `name` in `seed`'s draw (a module's chunks share one)."""
    bucket = hashlib.sha256(f"{seed}:{name.split('#')[0]}".encode()).digest()[0] % SPLIT_SHARE
    return {0: "validation", 1: "test"}.get(bucket, "train")


@dataclass(frozen=True)
class SeedDraw:
    """One seed's rows by source and split, as item names in the seed's order."""

    seed: int
    names: dict[str, dict[str, list[str]]]  # source -> split -> names

    def take(self, source: str, split: str, count: int) -> list[str]:
        names = self.names[source][split]
        if len(names) < count:
            raise ValueError(f"seed {self.seed}: {source} has {len(names)} {split} items, {count} needed")
        return names[:count]

    def training_rows(self, source: str, count: int) -> list[str]:
        """`count` training names: the seed's shuffle of the training split, repeated as needed."""
        names = self.names[source]["train"]
        return [names[index % len(names)] for index in range(count)]


def draw(sources: dict[str, dict[str, str]], seed: int) -> SeedDraw:
    """Every source's items split by `seed` and shuffled by it."""
    rng = random.Random(f"real-atlas-{seed}")
    names: dict[str, dict[str, list[str]]] = {}
    for source, items in sources.items():
        by_split: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
        for name in sorted(items):
            by_split[split_of(name, seed)].append(name)
        for split_names in by_split.values():
            rng.shuffle(split_names)
        names[source] = by_split
    return SeedDraw(seed, names)


def text_sources(prose_path: Path) -> dict[str, dict[str, str]]:
    """The code, prose and docs items by name (chat items are made by the frozen model: `runs`)."""
    return {"code": code_texts(), "prose": prose_texts(prose_path), "docs": doc_texts()}


def chat_items(count: int) -> dict[str, str]:
    """The chat instructions by name."""
    return {f"chat:{instruction}": instruction for instruction in chat_instructions(count)}
