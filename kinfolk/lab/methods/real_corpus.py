"""The offline text a real-boomerang run distils on and measures on, split once by name so no item is both.

Three sources, all on every machine: technical prose (the standard library's `pydoc_data.topics`), code (the
standard library's own top-level modules, PSF licence) and chat (instructions made from templates, answered by
the teacher greedily; its answers are the SFT rows and, on held-out instructions, the measurement). The
real-atlas experiments add Shakespeare's Sonnets (`prose_texts`) as prose. An item's split
is a function of its name alone (`heldout`), so every seed measures the same held-out rows; a seed draws which
training rows it distils on and in what order.

>>> heldout("topic:assert"), heldout("topic:comparisons")
(False, True)
>>> len(chat_instructions(120)), chat_instructions(2)
(120, ['Write two sentences about the moon.', 'Write two sentences about a river.'])
>>> len(chat_instructions(264)), len(split(doc_chunks())[1]) >= 64  # version 2's pools
(264, True)
>>> sonnets("I\\n  From fairest creatures\\n  we desire increase,\\nII\\n  When forty winters\\nTHE END")
['From fairest creatures\\n  we desire increase,', 'When forty winters']
"""

from __future__ import annotations

import hashlib
import random
import re
import sysconfig
from pathlib import Path

HELDOUT_SHARE = 4  # one item in four is held out
SOURCES = ("docs", "code", "chat")
TOPICS = (
    "the moon", "a river", "coffee", "a library", "winter", "a bicycle", "the ocean", "a city at night",
    "friendship", "a garden", "mountains", "the first computer", "rain", "a lighthouse", "bread", "music",
    "a train journey", "honeybees", "the desert", "a chess game", "clocks", "a volcano", "paper", "owls",
)  # fmt: skip
TEMPLATES = (
    "Write two sentences about {}.", "Give three facts about {}.", "Describe {} to a child.",
    "Suggest a title for a story about {}.", "Why do people like {}?",
    # appended for real-boomerang version 2's larger held-out pool; the first 120 instructions stay version 1's
    "Write a short poem about {}.", "List two questions a student might ask about {}.",
    "Explain in one paragraph how {} changes over a year.", "Compare {} with something from everyday life.",
    "Write a one-sentence advertisement for {}.", "What would a scientist find interesting about {}?",
)  # fmt: skip


def heldout(name: str) -> bool:
    """Whether the item called `name` belongs to the held-out (measurement) split."""
    return hashlib.sha256(name.encode()).digest()[0] % HELDOUT_SHARE == 0


def doc_texts() -> dict[str, str]:
    """The standard library's documentation topics, by name."""
    from pydoc_data.topics import topics

    return {f"topic:{name}": text.strip() for name, text in sorted(topics.items()) if len(text.strip()) > 400}


def doc_chunks(chunk_chars: int = 600) -> dict[str, str]:
    """The documentation topics cut into chunks of about `chunk_chars` characters at line ends (version 2's docs
    source: 20 held-out topics are too few rows); chunks are named by their topic, so a topic's chunks share a
    split."""
    from pydoc_data.topics import topics

    chunks = {}
    for name, text in sorted(topics.items()):
        chunks.update(_chunks(f"topic:{name}", text.strip(), chunk_chars))
    return chunks


def code_texts(chunk_chars: int = 1200) -> dict[str, str]:
    """The standard library's top-level modules, cut into chunks of about `chunk_chars` characters at line ends;
    chunks are named by their module, so a module's chunks share a split."""
    chunks = {}
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        chunks.update(_chunks(f"module:{path.stem}", path.read_text(encoding="utf-8", errors="replace"), chunk_chars))
    return chunks


def _chunks(name: str, text: str, chunk_chars: int) -> dict[str, str]:
    """`text` in pieces of at least `chunk_chars` characters ending at a line end, named `name#index` (a last piece
    shorter than that is dropped)."""
    chunks, current, index = {}, "", 0
    for line in text.splitlines(keepends=True):
        current += line
        if len(current) >= chunk_chars:
            chunks[f"{name}#{index}"] = current
            current, index = "", index + 1
    return chunks


def chat_instructions(count: int) -> list[str]:
    """`count` instructions, template-major (each template over every topic, then the next template)."""
    instructions = [template.format(topic) for template in TEMPLATES for topic in TOPICS]
    if count > len(instructions):
        raise ValueError(f"at most {len(instructions)} chat instructions, asked for {count}")
    return instructions[:count]


def split(items: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(training, held-out) items; a module's chunks follow their module's name."""
    train, held = {}, {}
    for name, text in items.items():
        (held if heldout(name.split("#")[0]) else train)[name] = text
    return train, held


def measurement_names(items: dict[str, str], rows: int) -> list[str]:
    """The first `rows` held-out items in a fixed shuffled order (the same for every seed)."""
    names = sorted(split(items)[1])
    random.Random("boomerang-heldout").shuffle(names)
    return names[:rows]


def seed_measurement_names(items: dict[str, str], rows: int, seed: int) -> list[str]:
    """`rows` held-out items drawn by `seed` (version 2: each seed measures its own draw of the held-out pool)."""
    names = sorted(split(items)[1])
    if len(names) < rows:
        raise ValueError(f"{len(names)} held-out items, {rows} needed")
    return random.Random(f"boomerang-measure-{seed}").sample(names, rows)


def training_draw(names: list[str], rows: int, seed: int) -> list[str]:
    """`rows` training items for one seed, in its order: a shuffle of all of them, repeated as needed."""
    rng = random.Random(seed)
    drawn: list[str] = []
    while len(drawn) < rows:
        order = sorted(names)
        rng.shuffle(order)
        drawn += order
    return drawn[:rows]


def sonnets(text: str) -> list[str]:
    """Each sonnet of the Gutenberg text (numbered by Roman numerals on their own lines, ending at THE END)."""
    pieces = re.split(r"^\s*[IVXLC]+\s*$", text.split("THE END")[0], flags=re.MULTILINE)[1:]
    return [piece.strip() for piece in pieces if piece.strip()]


def prose_texts(path: Path) -> dict[str, str]:
    """The Sonnets (`make real-models`'s Gutenberg text) by name, `sonnet:N`: the real-atlas experiments' prose."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the Sonnets are not there (run `make real-models`)")
    return {f"sonnet:{index + 1}": text for index, text in enumerate(sonnets(path.read_text(encoding="utf-8")))}
