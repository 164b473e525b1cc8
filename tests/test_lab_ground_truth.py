"""The lab's ground truth: p* and p_d of the SFT pool against a hand computation, determinism per seed, splits."""

import json
import math
import random
from collections import Counter

import pytest

from kinfolk.lab.world import corpus
from kinfolk.lab.world.skills import (
    ALL_SKILLS,
    GRADED,
    GRADED_LENGTHS,
    NOISE_MIXES,
    POOL_MIX,
    SKILLS,
    ideal_log_probability,
    pool_log_probability,
    response_kind,
    split_of,
)
from kinfolk.lab.world.tasks import write_task_data
from kinfolk.lab.world.tokenizer import build_lab_tokenizer


@pytest.mark.parametrize(
    ("skill", "prompt", "response", "p_d", "p_star"),
    [
        # good: the correct answer in the preferred format, drawn with probability 0.4
        ("add", "12+30=", "42", 0.4, 1.0),
        # off-format: 0.3 spread over the two other formats
        ("add", "12+30=", " 42", 0.15, 0.0),
        ("add", "12+30=", "[42]", 0.15, 0.0),
        # wrong: 0.3 spread over the 20 near-misses 42 ± 1..10
        ("add", "12+30=", "43", 0.015, 0.0),
        ("add", "12+30=", "32", 0.015, 0.0),
        ("add", "12+30=", "31", 0.0, 0.0),  # 11 away: not a near-miss, never drawn
        ("add", "12+30=", "[43]", 0.0, 0.0),  # wrong answers come only in the preferred format
        # reverse: 3 adjacent swaps of "dcba"
        ("reverse", "rev abcd=", "dcba", 0.4, 1.0),
        ("reverse", "rev abcd=", "cdba", 0.1, 0.0),
        ("reverse", "rev abcd=", "dcab", 0.1, 0.0),
        ("reverse", "rev abcd=", "abcd", 0.0, 0.0),
    ],
)
def test_pool_and_ideal_probabilities_match_a_hand_computation(skill, prompt, response, p_d, p_star):
    assert math.exp(pool_log_probability(SKILLS[skill], prompt, response)) == pytest.approx(p_d)
    assert math.exp(ideal_log_probability(SKILLS[skill], prompt, response)) == pytest.approx(p_star)


def test_pool_rows_carry_their_true_ratio_and_follow_the_mixture():
    pool = corpus.pool_dataset(["add", "reverse"], 4000, seed=3)
    for row in pool.select(range(200)):
        expected = 1 / POOL_MIX["good"] if row["kind"] == "good" else 0.0
        assert row["true_ratio"] == pytest.approx(expected)
        recomputed = pool_log_probability(SKILLS[row["skill"]], row["prompt"], row["completion"])
        assert row["pool_logprob"] == pytest.approx(recomputed)
    counts = Counter(pool["kind"])
    for kind, share in POOL_MIX.items():
        assert counts[kind] / len(pool) == pytest.approx(share, abs=0.03)
    # Σ p*(y|x) = 1 and E_{p_d}[p*/p_d] = 1: the true ratios average to 1 over the pool
    assert sum(pool["true_ratio"]) / len(pool) == pytest.approx(1.0, abs=0.08)


def test_data_is_deterministic_per_seed_and_evaluation_prompts_never_train():
    shares = {"add": 0.5, "reverse": 0.25, "copy": 0.25}
    assert corpus.pretraining_dataset(50, 1, shares).to_list() == corpus.pretraining_dataset(50, 1, shares).to_list()
    assert corpus.pretraining_dataset(50, 1, shares).to_list() != corpus.pretraining_dataset(50, 2, shares).to_list()
    assert corpus.pool_dataset(["add"], 30, 5).to_list() == corpus.pool_dataset(["add"], 30, 5).to_list()
    train_prompts = set(corpus.pretraining_dataset(2000, 0, shares)["prompt"])
    train_prompts |= set(corpus.pool_dataset(["add", "reverse"], 2000, 0)["prompt"])
    for skill in ALL_SKILLS:
        test_prompts = set(corpus.eval_problems(skill, 200)["prompt"])
        validation_prompts = set(corpus.eval_problems(skill, 200, split="validation")["prompt"])
        assert all(split_of(p) == "test" for p in test_prompts)
        assert all(split_of(p) == "validation" for p in validation_prompts)
        assert not test_prompts & train_prompts
        assert not validation_prompts & train_prompts
        assert not validation_prompts & test_prompts
        # every family draws its own test problems
        assert set(corpus.eval_problems(skill, 200, seed=1)["prompt"]) != test_prompts


def test_noise_mixes_draw_only_their_kinds_with_known_density():
    for name, mix in NOISE_MIXES.items():
        pool = corpus.pool_dataset(["reverse", "copy"], 600, 3, mix)
        kinds = set(pool["kind"])
        assert kinds == {kind for kind, share in mix.items() if share > 0}, name
        for row in pool:
            skill = SKILLS[row["skill"]]
            assert response_kind(skill, row["prompt"], row["completion"]) == row["kind"]
            assert math.exp(row["pool_logprob"]) == pytest.approx(
                math.exp(pool_log_probability(skill, row["prompt"], row["completion"], mix))
            )


def test_skills_solve_their_own_problems():
    rng = random.Random(0)
    for skill in ALL_SKILLS.values():
        for _ in range(20):
            prompt, answer = skill.sample(rng, "train")
            assert skill.solve(prompt) == answer
            assert answer not in skill.wrong(answer)
            assert len(set(skill.wrong(answer))) == len(skill.wrong(answer))


def test_graded_reversal_draws_every_length_and_levels_are_the_lengths():
    problems = corpus.eval_problems(GRADED, 300, split="validation")
    lengths = Counter(len(prompt.removeprefix("rev ").removesuffix("=")) for prompt in problems["prompt"])
    assert sorted(lengths) == list(range(GRADED_LENGTHS[0], GRADED_LENGTHS[1] + 1))
    assert min(lengths.values()) > 30  # about 60 of each
    skill = ALL_SKILLS[GRADED]
    assert [skill.level(p) for p in ("rev ab=", "rev qwxyz=")] == [2, 5]
    assert [skill.solve(p) for p in ("rev ab=", "rev qwxyz=")] == ["ba", "zyxwq"]
    assert GRADED not in SKILLS  # not scored at every build, no lm-eval task


def test_tokenizer_is_one_token_per_character():
    tokenizer = build_lab_tokenizer()
    text = "rev abcd=dcba\nprint(x)"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(tokenizer("é")["input_ids"]) == ["<unk>"]


def test_shipped_lm_eval_data_equals_the_generator(tmp_path):
    from kinfolk.lab.world.tasks import task_data_dir

    for written in write_task_data(tmp_path):
        shipped = task_data_dir() / written.name
        assert shipped.read_text() == written.read_text()
        rows = [json.loads(line) for line in written.read_text().splitlines()]
        skill = SKILLS[written.stem]
        assert all(skill.solve(row["prompt"]) == row["answer"] for row in rows)
