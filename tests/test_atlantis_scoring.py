"""ATLANTIS scoring against an independent per-example computation, across architectures, batch shapes,
tokenizers, the cache, IFD selection and every kind of bad input."""

import logging
import math
import re

import numpy as np
import pytest
import torch
from atlantis_helpers import reference_scores
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.plugins.atlantis import ScoreConfig, ScoringError, score_dataset, score_model
from kinfolk.plugins.atlantis import scoring as scoring_module
from kinfolk.testing import (
    ARCHITECTURES,
    build_model,
    build_tokenizer,
    conversational_dataset,
    perturbed_copy,
    prompt_completion_dataset,
    save_model,
)
from kinfolk.tokens import DatasetFormatError

NO_CACHE = ScoreConfig(use_cache=False)


def varied_dataset(n: int = 12, seed: int = 3) -> Dataset:
    """Prompt/completion rows of clearly different lengths, so padded batches really pad."""
    rows = prompt_completion_dataset(n, seed=seed).to_list()
    for i, row in enumerate(rows):
        row["completion"] = row["completion"] + " and so on" * (i % 4)
    return Dataset.from_list(rows)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_scores_equal_a_per_example_full_softmax_padded_or_not(tiny_kit, architecture):
    dataset = varied_dataset()
    model_dir = tiny_kit.model_dir(architecture)
    expected_sums, expected_counts = reference_scores(model_dir, dataset)
    for tokens_per_batch in (1, 4096):  # one unpadded row per batch, or every row in one padded batch
        config = ScoreConfig(use_cache=False, tokens_per_batch=tokens_per_batch)
        scores = score_model(dataset, model_dir, "small_base", config)
        np.testing.assert_allclose(scores.logprob, expected_sums, atol=3e-4, rtol=1e-5)
        assert scores.tokens.tolist() == expected_counts.tolist()


@pytest.mark.parametrize("architecture", ["llama", "gemma2"])
def test_conversations_score_the_assistant_turns_only(tiny_kit, architecture):
    dataset = conversational_dataset(6, seed=2)
    model_dir = tiny_kit.model_dir(architecture)
    expected_sums, expected_counts = reference_scores(model_dir, dataset)
    scores = score_model(dataset, model_dir, "reference", NO_CACHE)
    np.testing.assert_allclose(scores.logprob, expected_sums, atol=3e-4, rtol=1e-5)
    assert scores.tokens.tolist() == expected_counts.tolist()


def test_scoring_conversations_says_once_that_sfttrainer_trains_every_token_by_default(monkeypatch, caplog):
    monkeypatch.setattr(scoring_module, "_said", set())
    with caplog.at_level(logging.WARNING, logger=scoring_module.__name__):
        for _ in range(3):  # one call per model of a run
            assert scoring_module.scoring_sft_args(conversational_dataset(2), NO_CACHE).assistant_only_loss
        scoring_module.scoring_sft_args(prompt_completion_dataset(2), NO_CACHE)
        chosen = ScoreConfig(use_cache=False, assistant_only_loss=True)  # asked for: nothing to say
        scoring_module.scoring_sft_args(conversational_dataset(2), chosen)
    (said,) = [record.getMessage() for record in caplog.records]
    assert "SFTTrainer trains every token unless told assistant_only_loss=True" in said


@pytest.fixture(scope="module")
def other_family(tmp_path_factory):
    """A small base and its instruct sibling with a tokenizer of another vocabulary size (another family)."""
    root = tmp_path_factory.mktemp("other-family")
    tokenizer = build_tokenizer(vocab_size=300)
    base = build_model("qwen3", "small", seed=5, tokenizer=tokenizer)
    return {
        "small_base": save_model(base, tokenizer, root / "small"),
        "reference": save_model(perturbed_copy(base, seed=6), tokenizer, root / "small-instruct"),
    }


def test_cross_tokenizer_families_compare_per_byte(tiny_kit, other_family, caplog):
    dataset = varied_dataset(10, seed=8)
    large = tiny_kit.model_dir("llama", "large")
    scored = score_dataset(dataset, large_base=large, **other_family, config=NO_CACHE, clip="none")
    a, n_a = reference_scores(large, dataset)
    b, n_b = reference_scores(other_family["small_base"], dataset)
    np.testing.assert_allclose(scored["large_base_logprob"], a, atol=3e-4, rtol=1e-5)
    np.testing.assert_allclose(scored["small_base_logprob"], b, atol=3e-4, rtol=1e-5)
    assert scored["large_base_tokens"] == n_a.tolist() and scored["small_base_tokens"] == n_b.tolist()
    assert n_a.tolist() != n_b.tolist()  # the two tokenizers cut the same responses differently
    response_bytes = [len(c.encode()) for c in dataset["completion"]]
    assert scored["response_bytes"] == response_bytes  # bytes do not depend on the tokenizer
    per_byte = np.exp((a - b) / response_bytes)
    np.testing.assert_allclose(scored["weight"], per_byte / per_byte.mean(), rtol=2e-3)
    with caplog.at_level(logging.WARNING):
        score_dataset(dataset, large_base=large, **other_family, config=NO_CACHE, normalization="token")
    assert "use normalization='byte'" in caplog.text


def test_interrupted_run_resumes_without_recomputing(tiny_kit, tmp_path, monkeypatch):
    dataset = varied_dataset(20, seed=4)
    model_dir = tiny_kit.model_dir("qwen2")
    config = ScoreConfig(chunk_rows=4, cache_dir=str(tmp_path))  # 5 chunks

    class Killed(Exception):
        pass

    first_run = []

    def killed_after_two_chunks(chunk):
        first_run.append(chunk)
        if len(first_run) == 2:
            raise Killed

    with pytest.raises(Killed):
        score_model(dataset, model_dir, "small_base", config, after_chunk=killed_after_two_chunks)
    second_run = []
    resumed = score_model(dataset, model_dir, "small_base", config, after_chunk=second_run.append)
    assert len(second_run) == 3 and sorted(first_run + second_run) == [0, 1, 2, 3, 4]
    uninterrupted = score_model(dataset, model_dir, "small_base", ScoreConfig(chunk_rows=4, use_cache=False))
    np.testing.assert_array_equal(resumed.logprob, uninterrupted.logprob)

    def no_model(*args, **kwargs):
        raise AssertionError("a fully cached run must not load the model")

    monkeypatch.setattr(scoring_module, "load_model", no_model)
    cached = score_model(dataset, model_dir, "small_base", config)
    np.testing.assert_array_equal(cached.logprob, uninterrupted.logprob)


def test_cache_is_keyed_by_model_dataset_and_template(tiny_kit, tmp_path):
    dataset = conversational_dataset(6)
    config = ScoreConfig(cache_dir=str(tmp_path))
    score_model(dataset, tiny_kit.model_dir("llama"), "small_base", config)
    score_model(dataset, tiny_kit.model_dir("llama"), "small_base", config)  # same key: reused
    assert len(list(tmp_path.iterdir())) == 1
    score_model(dataset.select(range(5)), tiny_kit.model_dir("llama"), "small_base", config)  # dataset
    score_model(dataset, tiny_kit.model_dir("mistral"), "small_base", config)  # model
    all_tokens = ScoreConfig(cache_dir=str(tmp_path), assistant_only_loss=False)
    score_model(dataset, tiny_kit.model_dir("llama"), "small_base", all_tokens)  # template / masking
    assert len(list(tmp_path.iterdir())) == 4


def test_ifd_selection_keeps_the_top_fraction_by_hand_computed_ifd(tiny_kit):
    dataset = varied_dataset(20, seed=6)
    family = tiny_kit.family("llama")
    small = family["small_base"]
    conditional, n_conditional = reference_scores(small, dataset)
    alone_rows = Dataset.from_list([{"prompt": "", "completion": c} for c in dataset["completion"]])
    alone, n_alone = reference_scores(small, alone_rows)
    ifd = np.exp(alone / n_alone - conditional / n_conditional)
    eligible = [i for i in range(20) if ifd[i] < 1]
    expected = sorted(sorted(eligible, key=lambda i: -ifd[i])[: min(math.ceil(0.3 * 20), len(eligible))])

    scored = score_dataset(
        dataset.add_column("id", list(range(20))),
        large_base=family["large_base"],
        small_base=small,
        config=NO_CACHE,
        select_fraction=0.3,
    )
    assert scored["id"] == expected
    np.testing.assert_allclose(scored["ifd"], ifd[expected], rtol=1e-3)
    assert np.mean(scored["weight"]) == pytest.approx(1.0)


# --- bad input ---------------------------------------------------------------------------------------------


def test_missing_columns_name_expected_and_present(tiny_kit):
    dataset = Dataset.from_dict({"question": ["q"], "answer": ["a"]})
    with pytest.raises(DatasetFormatError, match=r"prompt \+ completion.*columns present: \['answer', 'question'\]"):
        score_dataset(dataset, large_base=tiny_kit.model_dir("llama"), small_base=tiny_kit.model_dir("llama"))


def test_missing_model_for_the_formula_is_named(tiny_kit):
    with pytest.raises(ValueError, match="formula 'influence' needs the reference model"):
        score_dataset(prompt_completion_dataset(2), small_base=tiny_kit.model_dir("llama"), formula="influence")


def test_empty_responses_are_named_by_row(tiny_kit):
    rows = prompt_completion_dataset(5).to_list()
    rows[1]["completion"], rows[3]["completion"] = "", "  "
    with pytest.raises(ScoringError, match=r"rows \[1, 3\] have an empty response"):
        score_dataset(Dataset.from_list(rows), large_base=tiny_kit.model_dir("llama"), small_base="unused")
    messages = conversational_dataset(3).to_list()
    messages[2]["messages"] = messages[2]["messages"][:-1]  # no assistant turn
    with pytest.raises(ScoringError, match=r"rows \[2\] have an empty response"):
        score_dataset(Dataset.from_list(messages), large_base="unused", small_base="unused")


def test_pretokenised_data_is_refused(tiny_kit):
    dataset = prompt_completion_dataset(2).add_column("input_ids", [[1, 2], [3]])
    with pytest.raises(DatasetFormatError, match="already tokenised"):
        score_model(dataset, tiny_kit.model_dir("llama"), "small_base", NO_CACHE)


def test_overlong_rows_error_or_are_skipped_and_counted(tiny_kit):
    dataset = varied_dataset(8, seed=1)
    model_dir = tiny_kit.model_dir("olmo2")
    lengths = [
        len(ids)
        for ids in AutoTokenizer.from_pretrained(model_dir)(
            [p + c + "<|im_end|>" for p, c in zip(dataset["prompt"], dataset["completion"])]
        )["input_ids"]
    ]
    limit = sorted(lengths)[5]
    too_long = [i for i, n in enumerate(lengths) if n > limit]
    assert too_long
    pattern = re.escape(f"rows {too_long} are longer than small_base model") + rf".*olmo2.*context of {limit}"
    pattern += ".*;" + re.escape(
        " pass overlong='skip' to leave them unscored, or a larger max_length"
    )  # Python spelling
    with pytest.raises(ScoringError, match=pattern):
        score_model(dataset, model_dir, "small_base", ScoreConfig(use_cache=False, max_length=limit))
    family = tiny_kit.family("olmo2")
    scored = score_dataset(
        dataset,
        large_base=family["large_base"],
        small_base=model_dir,
        config=NO_CACHE,
        max_length=limit,
        overlong="skip",
        clip="none",
    )
    weights = np.array(scored["weight"])
    skipped = np.isnan(scored["small_base_logprob"])
    assert np.flatnonzero(skipped).tolist() == too_long
    assert weights[skipped].tolist() == [0.0] * len(too_long)
    assert weights[~skipped].mean() == pytest.approx(1.0)
    expected, _ = reference_scores(model_dir, dataset.select(np.flatnonzero(~skipped)))
    np.testing.assert_allclose(np.asarray(scored["small_base_logprob"])[~skipped], expected, atol=3e-4, rtol=1e-5)


def test_conversations_need_a_chat_template(tiny_kit, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_kit.model_dir("llama"))
    tokenizer.chat_template = None
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama"))
    bare = save_model(model, tokenizer, tmp_path / "no-template")
    with pytest.raises(DatasetFormatError, match=r"large_base model .*no-template.*no chat template"):
        score_dataset(conversational_dataset(2), large_base=bare, small_base=bare, config=NO_CACHE)


def test_non_finite_log_probs_name_the_row_and_model(tiny_kit, tmp_path):
    dataset = prompt_completion_dataset(8, seed=9)
    tokenizer = AutoTokenizer.from_pretrained(tiny_kit.model_dir("llama"))
    ids = [set(tokenizer(p + c)["input_ids"]) for p, c in zip(dataset["prompt"], dataset["completion"])]
    row, token = next((r, t) for r, row_ids in enumerate(ids) for t in row_ids if sum(t in o for o in ids) == 1)
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama"))
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = float("nan")  # only row `row` contains this token
    broken = save_model(model, tokenizer, tmp_path / "broken")
    with pytest.raises(
        ScoringError, match=rf"reference model .*broken gave a non-finite log-prob \(nan\) for row {row}\b"
    ):
        score_model(dataset, broken, "reference", NO_CACHE)
