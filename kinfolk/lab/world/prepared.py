"""Training rows prepared once for several lab trainers: `PreparingOnce` is a `WeightedSFTTrainer` that keeps the
train dataset it prepared (tokenised, weighted per token, truncated) in a dict its caller owns, under a key of what
the preparation reads, and takes it from there when another trainer would prepare the same rows the same way.

A family's two bases pretrain on the same rows with the same tokenizer and recipe and differ only in the model and
its step budget, which the preparation never reads: preparing the rows twice cost a quick build about 8 of its 133 s
of CPU (TRL's tokenisation of 32,000 rows, then the weight columns and truncation). The second base trains on the
very rows the first prepared, so its weights are the same bits as when it prepared them itself.
"""

from __future__ import annotations

import json

from datasets import Dataset
from datasets.fingerprint import Hasher

from kinfolk.trainers import WeightedSFTTrainer

# Options of the run that the dataset's preparation does not read (the model, the schedule, where the run writes).
RUN_OPTIONS = frozenset({"output_dir", "max_steps", "learning_rate", "warmup_steps", "logging_steps", "disable_tqdm"})


def preparation_key(dataset: Dataset, tokenizer, args, retained: Dataset | None) -> str:
    """What a trainer's preparation of `dataset` reads: the rows, the tokenizer, every option but `RUN_OPTIONS`, and
    the retained rows that replay mixes in (their fingerprints: datasets hashes a table's content)."""
    options = {name: value for name, value in args.to_dict().items() if name not in RUN_OPTIONS}
    retained_rows = None if retained is None else retained._fingerprint
    read = [dataset._fingerprint, Hasher.hash(tokenizer), retained_rows, options]
    return Hasher.hash(json.dumps(read, sort_keys=True, default=repr))


class PreparingOnce(WeightedSFTTrainer):
    """`WeightedSFTTrainer` whose train dataset comes from `prepared` (key -> prepared dataset) when an earlier
    trainer there prepared the same rows the same way, and goes there otherwise."""

    def __init__(self, *args, prepared: dict[str, Dataset], **kwargs):
        self._prepared = prepared  # read by `_prepare_dataset`, which SFTTrainer.__init__ calls
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
        if dataset_name != "train" or formatting_func is not None or not isinstance(dataset, Dataset):
            return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)
        key = preparation_key(dataset, processing_class, args, self._retained_source)
        if key not in self._prepared:
            self._prepared[key] = super()._prepare_dataset(
                dataset, processing_class, args, packing, formatting_func, dataset_name
            )
        return self._prepared[key]
