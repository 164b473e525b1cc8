"""The lab's family build: deterministic per seed, cached by config hash, and (slow) the quick size passes. The micro
family is conftest's, built once per session."""

from pathlib import Path

import pytest
from lab_helpers import MICRO
from safetensors.torch import load_file

from kinfolk.lab.world import family as lab_family
from kinfolk.lab.world.family import MODELS, Family, LabConfig, build_family, load_family
from kinfolk.lab.world.skills import SKILLS


def test_micro_family_has_every_model_scored(micro_family):
    assert set(micro_family.scores) == set(MODELS)
    for name, path in micro_family.models.items():
        assert (path / "config.json").exists(), name
        assert set(micro_family.scores[name]) == set(SKILLS)
    assert micro_family.load("large_base").config.num_hidden_layers == 2
    assert micro_family.passed  # no thresholds asked


def test_second_build_hits_the_cache(micro_family, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("the second build trained a model")

    monkeypatch.setattr(lab_family, "train", no_training)
    again = build_family(LabConfig(**MICRO), cache_dir=micro_family.root.parent, progress=False)
    assert again.root == micro_family.root
    assert again.scores == micro_family.scores
    assert load_family(micro_family.root).config == micro_family.config


def test_build_is_deterministic_per_seed_whether_or_not_its_trainers_share_prepared_rows(
    micro_family, tmp_path, monkeypatch
):
    """The session's micro family is built with its trainers sharing prepared rows (the two bases pretrain on the
    same rows); a rebuild whose trainers each prepare their own rows gives the same bits. Whether sharing happens is
    `test_trainers_share_prepared_rows_only_where_the_preparation_reads_the_same`'s."""
    from kinfolk.lab.world import members

    offered, real_lab_trainer = [], members.lab_trainer

    def preparing_its_own(model, dataset, tokenizer, output_dir, *args, prepared, **options):
        offered.append((prepared, dataset))
        return real_lab_trainer(model, dataset, tokenizer, output_dir, *args, **options)

    with monkeypatch.context() as patched:
        patched.setattr(members, "lab_trainer", preparing_its_own)
        rebuilt = build_family(LabConfig(**MICRO), cache_dir=tmp_path, progress=False)
    # one dict offered to every trainer of the build, and the bases' rows are one dataset
    assert len(offered) == len(MODELS) and all(prepared is offered[0][0] for prepared, _ in offered)
    assert offered[0][1] is offered[1][1]
    other_seed = build_family(LabConfig(**(MICRO | {"seed": 1})), cache_dir=tmp_path, progress=False)
    assert rebuilt.root.name == micro_family.root.name != other_seed.root.name
    for name in MODELS:
        first = load_file(micro_family.models[name] / "model.safetensors")
        second = load_file(rebuilt.models[name] / "model.safetensors")
        third = load_file(other_seed.models[name] / "model.safetensors")
        assert all((first[key] == second[key]).all() for key in first), name
        assert any((first[key] != third[key]).any() for key in first), name


def test_config_changes_change_the_cache_key():
    assert LabConfig().cache_key() != LabConfig(post_train_steps=1).cache_key()
    assert LabConfig().cache_key() == LabConfig().cache_key()


def test_post_trained_skills_key_only_the_post_trained_models_and_only_when_set():
    default, graded = LabConfig(), LabConfig(post_trained_skills=["copy", "reverse", "reverse_graded"])
    assert LabConfig(post_trained_skills=["copy", "reverse"]).cache_key() == default.cache_key()
    assert graded.cache_key() != default.cache_key()
    for name in MODELS:
        assert (graded.model_key(name) == default.model_key(name)) == (name in ("small_base", "large_base")), name
    family = Family(Path("unused"), graded, {}, [], {})
    assert set(family.instruct_data(30)["skill"]) == {"copy", "reverse", "reverse_graded"}
    assert set(Family(Path("unused"), default, {}, [], {}).instruct_data(30)["skill"]) == {"copy", "reverse"}


@pytest.mark.slow
@pytest.mark.xdist_group("quick-lab-family")  # one worker builds the family, the other test reuses it
def test_quick_family_reaches_its_thresholds(lab_cache_dir):
    family = build_family(LabConfig.quick_config(), cache_dir=lab_cache_dir, progress=False)
    assert family.checks, "the quick config checks thresholds"
    assert family.passed, family.summary()
    # the ground truth the lab promises: post-training on p* moves the instruct model to the preferred format
    assert (
        family.scores["large_instruct"]["add"]["preferred_format"]
        > family.scores["large_base"]["add"]["preferred_format"]
    )


@pytest.mark.slow
def test_same_key_same_bits_whatever_the_thread_count(tmp_path):
    """A family build pins torch to one thread. Without the pin, this config's large base differs in its bits
    between 1 and 2 threads on the 2-core development machine (measured); with it, the bits agree."""
    import torch

    config = LabConfig(
        **(
            MICRO
            | {
                "large_shape": {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 512},
                "large_pretrain_steps": 8,
                "batch_size": 32,
            }
        )
    )
    before = torch.get_num_threads()
    weights = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            family = build_family(config, cache_dir=tmp_path / f"threads-{threads}", progress=False)
            assert torch.get_num_threads() == threads  # the pin is undone after the build
            weights.append({name: load_file(family.models[name] / "model.safetensors") for name in MODELS})
    finally:
        torch.set_num_threads(before)
    for name in MODELS:
        assert all(torch.equal(weights[0][name][k], weights[1][name][k]) for k in weights[0][name]), name


def test_a_family_below_its_thresholds_is_refused_unless_allowed(micro_family, tmp_path):
    impossible = MICRO | {"thresholds": {"large_instruct": {"reverse": ("accuracy", 1.01)}}}
    with pytest.raises(lab_family.FamilyBelowThreshold, match=r"large_instruct reverse accuracy 0\.\d\d < 1\.01"):
        build_family(LabConfig(**impossible), cache_dir=micro_family.root.parent, progress=False)
    kept = build_family(LabConfig(**impossible), cache_dir=micro_family.root.parent, progress=False, allow_failed=True)
    assert not kept.passed
    assert kept.warning().startswith("WARNING: lab family") and "large_instruct reverse" in kept.warning()
    assert micro_family.warning() == ""
    # refused again from the cache, not only right after training
    with pytest.raises(lab_family.FamilyBelowThreshold):
        build_family(LabConfig(**impossible), cache_dir=micro_family.root.parent, progress=False)


def test_pretraining_stops_once_the_skill_is_learned(tmp_path):
    config = LabConfig(**(MICRO | {"large_pretrain_steps": 12}))
    config.large_pretrain_until = {"skill": "copy", "metric": "answer_accuracy", "at_least": 0.0, "every": 4}
    assert build_family(config, cache_dir=tmp_path, progress=False).steps["large_base"] == 4  # holds at the 1st check
    config.large_pretrain_until["at_least"] = 1.1  # never holds: every step is trained
    family = build_family(config, cache_dir=tmp_path, progress=False)
    assert family.steps == {
        "small_base": MICRO["small_pretrain_steps"],
        "large_base": 12,
        **dict.fromkeys(("small_instruct", "large_instruct", "large_bracket"), MICRO["post_train_steps"]),
    }


def test_models_whose_key_is_unchanged_are_copied_from_another_family(micro_family, monkeypatch):
    trained = []
    real_train = lab_family.train

    def counting_train(model, dataset, tokenizer, out, *args, **kwargs):
        trained.append(out.name)
        return real_train(model, dataset, tokenizer, out, *args, **kwargs)

    monkeypatch.setattr(lab_family, "train", counting_train)
    changed = LabConfig(**(MICRO | {"post_train_steps": 3}))
    assert changed.model_key("large_base") == micro_family.config.model_key("large_base")
    assert changed.model_key("large_instruct") != micro_family.config.model_key("large_instruct")
    family = build_family(changed, cache_dir=micro_family.root.parent, progress=False)
    assert family.root != micro_family.root
    assert sorted(trained) == ["large_bracket", "large_instruct", "small_instruct"]  # the bases were copied
    for name in ("small_base", "large_base"):
        old, new = (load_file(f.models[name] / "model.safetensors") for f in (micro_family, family))
        assert all((old[key] == new[key]).all() for key in old), name
    assert family.steps["small_instruct"] == 3 and family.steps["large_base"] == micro_family.steps["large_base"]


def test_trainers_share_prepared_rows_only_where_the_preparation_reads_the_same(micro_family, tmp_path):
    from kinfolk.lab.world.training import lab_trainer

    tokenizer, rows = micro_family.tokenizer(), micro_family.pretraining(24)

    def trainer(prepared, **options):
        options = {"steps": 3, "learning_rate": 1e-3} | options
        base = micro_family.models["small_base"]
        return lab_trainer(base, rows, tokenizer, tmp_path, progress=False, prepared=prepared, **options)

    prepared = {}
    first = trainer(prepared)
    same = trainer(prepared, steps=5, learning_rate=2e-3)  # another schedule: the same preparation
    other = trainer(prepared, prompt_loss_weight=0.5)  # other token weights
    assert same.train_dataset is first.train_dataset and other.train_dataset is not first.train_dataset
    assert len(prepared) == 2
    for shared, options in ((first, {}), (other, {"prompt_loss_weight": 0.5})):
        assert shared.train_dataset.to_dict() == trainer(None, **options).train_dataset.to_dict()
