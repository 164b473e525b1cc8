"""ATLANTIS scoring on real checkpoints of three families (`make test-real`; skipped without `make real-models`).

Qwen2.5-Coder-0.5B, SmolLM2-135M and Gemma-3-270M have 151k, 49k and 262k vocabularies, real chat templates,
BOS conventions and Gemma's soft-capping: the scorer must still equal the per-example full softmax.
"""

import numpy as np
import pytest
from atlantis_helpers import reference_scores

from kinfolk.testing import conversational_dataset, prompt_completion_dataset
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
