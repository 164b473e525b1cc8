"""ATLANTIS scoring refuses what would fail after hours, before the first forward pass, naming the role and file;
empty datasets are kinfolk's error, not TRL's StopIteration; a corrupt cache chunk is rescored with a warning."""

import logging
import shutil

import numpy as np
import pytest
from datasets import Dataset
from refusal_helpers import assert_refused

from kinfolk.errors import (
    CorruptFileError,
    EmptyDatasetError,
    ModelInputError,
    OutputExistsError,
    OutputNotWritableError,
)
from kinfolk.plugins.atlantis import ScoreConfig, check_scoring_inputs, score_dataset, score_model
from kinfolk.plugins.atlantis import scoring as scoring_module
from kinfolk.plugins.atlantis.cache import ScoreCache
from kinfolk.testing import build_tokenizer, prompt_completion_dataset
from kinfolk.tokens import sft_tokenize


@pytest.fixture
def no_forward_pass(monkeypatch):
    """Fails the test if any model is loaded for scoring: refusals must come before the expensive part."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a forward pass before the bad input was found")

    monkeypatch.setattr(scoring_module, "load_model", refuse)


@pytest.fixture(scope="module")
def family(tiny_kit):
    return tiny_kit.family("llama")


def broken_copy(source, out, file, keep=None, text=None):
    shutil.copytree(source, out)
    if text is not None:
        (out / file).write_text(text)
    elif keep is None:
        (out / file).unlink()
    else:
        data = (out / file).read_bytes()
        (out / file).write_bytes(data[:keep])
    return out


# --- empty datasets ----------------------------------------------------------------------------------------------


def test_an_empty_dataset_is_refused_by_score_dataset(family, no_forward_pass):
    empty = prompt_completion_dataset(2).select([])
    error = assert_refused(
        lambda: score_dataset(empty, large_base=family["large_base"], small_base=family["small_base"]),
        EmptyDatasetError,
        "has no rows",
    )
    assert not isinstance(error.__context__, StopIteration)


def test_an_empty_dataset_is_refused_by_score_model_and_sft_tokenize(family, no_forward_pass):
    empty = Dataset.from_dict({"text": []})
    assert_refused(
        lambda: score_model(empty, family["small_base"], "small_base", ScoreConfig(use_cache=False)),
        EmptyDatasetError,
        "small_base",
        family["small_base"],
    )
    assert_refused(lambda: sft_tokenize(empty, build_tokenizer()), EmptyDatasetError, "columns ['text']")


# --- models: checked before any forward pass ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("problem", "error", "named"),
    [
        ("missing", ModelInputError, "no such directory"),
        ("a file", ModelInputError, "is a file"),
        ("no config", ModelInputError, "has no config.json"),
        ("broken config", CorruptFileError, "config.json is not valid JSON"),
        ("no weights", ModelInputError, "has no weights"),
        ("truncated weights", CorruptFileError, "model.safetensors is not a readable safetensors file"),
        ("broken tokenizer", CorruptFileError, "tokenizer.json is not valid JSON"),
        ("no tokenizer", ModelInputError, "cannot load its tokenizer"),
    ],
)
def test_a_bad_small_base_is_named_before_the_large_base_is_scored(
    family, tmp_path, no_forward_pass, problem, error, named
):
    source, bad = family["small_base"], tmp_path / "small"
    if problem == "a file":
        bad.write_text("not a model")
    elif problem == "no config":
        broken_copy(source, bad, "config.json")
    elif problem == "broken config":
        broken_copy(source, bad, "config.json", text='{"model_type": ')
    elif problem == "no weights":
        broken_copy(source, bad, "model.safetensors")
    elif problem == "truncated weights":
        broken_copy(source, bad, "model.safetensors", keep=300)
    elif problem == "broken tokenizer":
        broken_copy(source, bad, "tokenizer.json", keep=100)
    elif problem == "no tokenizer":
        shutil.copytree(source, bad, ignore=shutil.ignore_patterns("tokenizer*", "*.jinja"))
    assert_refused(
        lambda: score_dataset(
            prompt_completion_dataset(3), large_base=family["large_base"], small_base=bad, use_cache=False
        ),
        error,
        "small_base",
        named,
        inputs=[bad] if bad.exists() else [],
    )


@pytest.mark.parametrize(
    ("given", "options", "named"),
    [
        (["large_base"], {"formula": "ratio"}, "formula 'ratio' needs the small_base model; given: large_base"),
        (["small_base"], {"formula": "influence"}, "needs the reference model"),
        (["large_base"], {"formula": "algorithm1"}, "needs the small_base, reference models"),
        (
            ["small_base", "reference"],
            {"formula": "influence", "select_fraction": 0.5, "ifd_model": "large_base"},
            "IFD selection by the large_base model needs the large_base model",
        ),
    ],
)
def test_the_models_a_formula_needs_are_named(family, no_forward_pass, given, options, named):
    paths = {
        "large_base": family["large_base"],
        "small_base": family["small_base"],
        "reference": family["small_instruct"],
    }
    assert_refused(
        lambda: score_dataset(
            prompt_completion_dataset(3), **{r: paths[r] for r in given}, use_cache=False, **options
        ),
        ModelInputError,
        named,
    )


def test_an_unwritable_cache_is_named_before_scoring(family, tmp_path, no_forward_pass):
    (tmp_path / "a-file").write_text("")
    config = ScoreConfig(cache_dir=str(tmp_path / "a-file" / "cache"))
    assert_refused(
        lambda: score_dataset(
            prompt_completion_dataset(3),
            large_base=family["large_base"],
            small_base=family["small_base"],
            config=config,
        ),
        OutputNotWritableError,
        tmp_path / "a-file",
        "is a file",
    )


def test_preflight_refuses_an_existing_or_unwritable_out_and_creates_nothing(family, tmp_path):
    models = {"large_base": family["large_base"], "small_base": family["small_base"]}
    config = ScoreConfig(use_cache=False)
    (tmp_path / "scored").mkdir()
    assert_refused(
        lambda: check_scoring_inputs(models, config, out=tmp_path / "scored"), OutputExistsError, tmp_path / "scored"
    )
    (tmp_path / "file").write_text("")
    assert_refused(
        lambda: check_scoring_inputs(models, config, out=tmp_path / "file" / "deeper" / "scored"),
        OutputNotWritableError,
        tmp_path / "file",
        destination=tmp_path / "file" / "deeper" / "scored",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "scored"]
    configs = check_scoring_inputs(models, config, out=tmp_path / "new" / "scored")
    assert set(configs) == {"large_base", "small_base"} and not (tmp_path / "new").exists()
    assert_refused(lambda: check_scoring_inputs({"big": family["large_base"]}, config), ModelInputError, "'big'")


# --- the score cache: a chunk that cannot be read back is rescored, with a warning naming it --------------------


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other rows", "empty file"])
def test_a_corrupt_cache_chunk_is_discarded_named_and_rescored(family, tmp_path, caplog, damage):
    dataset = prompt_completion_dataset(12)
    config = ScoreConfig(cache_dir=str(tmp_path), chunk_rows=4)
    first = score_model(dataset, family["small_base"], "small_base", config)
    (chunk,) = [path for path in tmp_path.rglob("chunk-000001.npz")]
    if damage == "truncated":
        chunk.write_bytes(chunk.read_bytes()[:-40])
    elif damage == "garbage":
        chunk.write_bytes(b"\x00" * 100)
    elif damage == "empty file":
        chunk.write_bytes(b"")
    else:
        cache = ScoreCache(tmp_path, chunk.parent.name, {})
        cache.write(1, rows=np.array([0, 1, 2, 3]), logprob=np.zeros(4))
    rescored = []
    with caplog.at_level(logging.WARNING):
        second = score_model(dataset, family["small_base"], "small_base", config, after_chunk=rescored.append)
    assert str(chunk) in caplog.text and "scoring its rows again" in caplog.text
    assert rescored == [1]  # only the damaged chunk is computed again
    np.testing.assert_array_equal(first.logprob, second.logprob)
    third = []
    score_model(dataset, family["small_base"], "small_base", config, after_chunk=third.append)
    assert third == []  # the rescored chunk was cached again
