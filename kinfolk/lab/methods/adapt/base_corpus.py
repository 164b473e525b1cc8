"""The base student's SFT corpus (adapt-controls, adapt-frontier): problems no variant was post-trained on.

Version 1 distilled the base student's SFT phase on `Family.instruct_data` in the preferred format, whose generator
is the one `large_instruct` was post-trained with: the base student saw that variant's own post-training rows, so
transferring its delta to `large_instruct` was close to circular. Here the corpus has its own generator stream and
every prompt any variant was post-trained on is removed explicitly (independent draws over a small problem space
collide: 5.6-6.6 % of the raw stream's rows in families 0-4).

The corpus is drawn in the base's (preferred) format, whose answer is the bare answer, so `base_sft_corpus(...,
format_index=...)` gives the very same problems with their answers in another format (adapt-frontier's format arm:
the base student taught `large_bracket`'s format instead of `large_instruct`'s).

>>> BASE_CORPUS_OFFSET > 1000 * 9 + 6
True
>>> base, bracket = format_of(BASE), format_of("large_bracket")
>>> render(render("olleh", base), bracket)  # the preferred format's answer is the bare answer
'[olleh]'
"""

from __future__ import annotations

from datasets import Dataset

from kinfolk.lab.methods.adapt.settings import BASE, format_of
from kinfolk.lab.world import corpus
from kinfolk.lab.world.family import Family
from kinfolk.lab.world.skills import render

# The corpus's generator seed is family seed + this: above every seed the lab's families draw their own data from
# (seed + 0..6, 1000 * seed + a pool draw) for family seeds below 9.
BASE_CORPUS_OFFSET = 10_000
VARIANTS = ("large_instruct", "large_bracket")  # every post-trained variant of an ADAPT family


def variant_post_training_prompts(family: Family, variants=VARIANTS) -> set[str]:
    """Every prompt the variants were post-trained on (`build_family`: `instruct_data` of batch × steps rows in
    each variant's format)."""
    rows = family.config.batch_size * family.config.post_train_steps
    return {prompt for variant in variants for prompt in family.instruct_data(rows, format_of(variant))["prompt"]}


def base_sft_corpus(family: Family, n: int, variants=VARIANTS, format_index: int = format_of(BASE)) -> Dataset:
    """`n` correct answers to problems of the post-trained skills, none of whose prompts is among the variants'
    post-training prompts, in `FORMATS[format_index]` (default: the base's preferred one)."""
    excluded = variant_post_training_prompts(family, variants)
    seed = family.config.seed + BASE_CORPUS_OFFSET
    drawn = 2 * n
    while True:  # a longer draw of the same stream starts with the same rows, so this only extends it
        rows = corpus.ideal_dataset(family.config.post_trained_skills, drawn, seed, format_of(BASE))
        kept = [i for i, prompt in enumerate(rows["prompt"]) if prompt not in excluded]
        if len(kept) >= n:
            chosen = rows.select(kept[:n])
            if format_index == format_of(BASE):
                return chosen
            return chosen.map(lambda row: {"completion": render(row["completion"], format_index)})
        drawn *= 2
