"""The scorer's output is the weighted trainer's input: its `weight` column trains as it says, skipped rows included."""

import numpy as np
import torch
from sft_helpers import batch_loss_and_grads, weighted_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.plugins.atlantis import score_dataset
from kinfolk.testing import prompt_completion_dataset


def test_scored_dataset_trains_with_its_weights(tiny_kit, tmp_path):
    family = tiny_kit.family("llama")
    dataset = prompt_completion_dataset(8, seed=4)
    lengths = [len(p) + len(c) for p, c in zip(dataset["prompt"], dataset["completion"])]
    scored = score_dataset(
        dataset,
        large_base=family["large_base"],
        small_base=family["small_base"],
        use_cache=False,
        max_length=int(np.sort([n // 2 for n in lengths])[-2]),  # a short context, so some rows are skipped
        overlong="skip",
    )
    skipped = np.isnan(scored["small_base_logprob"])
    assert skipped.any() and not skipped.all()

    tokenizer = AutoTokenizer.from_pretrained(family["large_base"])
    model = AutoModelForCausalLM.from_pretrained(family["large_base"], dtype=torch.float32)
    trainer = weighted_trainer(tokenizer, scored, tmp_path, model=model)  # reads "weight" by default
    batch = trainer.data_collator([trainer.train_dataset[row] for row in range(len(scored))])
    per_example = batch["loss_weights"].max(dim=1).values.double().numpy()
    np.testing.assert_allclose(per_example, scored["weight"], rtol=1e-6)  # skipped rows: weight 0, no loss
    assert per_example[skipped].tolist() == [0.0] * int(skipped.sum())
    loss, _ = batch_loss_and_grads(trainer)
    assert torch.isfinite(loss) and loss > 0
