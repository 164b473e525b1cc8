"""real-atlas version 2 (`real-atlas-compare`) in micro: a tiny Llama, two seeds through the protocol's runner, every
run trained and measured by `kinfolk compare`'s code. The primaries' per-seed values are recomputed here by hand
from the kept `drift.jsonl` files alone (the drift as the sources' geometric mean, the level, the first crossing on
validation, the test drift interpolated there; PEFT's forgetting figure and the test gain the same way from the
retained NLL and the test target), and a second run of the seeds trains nothing."""

import contextlib
import dataclasses
import json
import math
import shutil
from itertools import pairwise
from pathlib import Path

import pytest

from kinfolk.lab.experiments.real_atlas_compare.experiment import PRIMARY_FRACTION, RealAtlasCompare
from kinfolk.lab.experiments.real_atlas_compare_gemma.experiment import RealAtlasCompareGemma
from kinfolk.lab.experiments.real_atlas_compare_gemma.settings import RealAtlasCompareGemmaSettings
from kinfolk.lab.methods.real_atlas_compare.settings import RealAtlasCompareSettings
from kinfolk.lab.protocol.actions import analyse, make_runs, run_keys, write_experiment_plan

SOURCES = ("chat", "prose", "docs")
ROMAN = ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII")


def made_and_analysed(experiment_class, settings_class, root: Path, model: Path, **design):
    """(the settings, the results) of a micro experiment, its two seeds made and analysed."""
    sonnets = "\n".join(f"{number}\n  a line of {number}\n  and more of {number}\n  another\n  the last"
                        for number in ROMAN) + "\nTHE END\n"  # fmt: skip
    (root / "sonnets.txt").write_text(sonnets)
    settings = settings_class(
        model=str(model),
        **design,
        output_kl_coefs=[1.0, 3.0],
        output_kl_extensions=1,
        levels=[0.25, 0.5],
        max_steps=6,
        eval_points=3,
        batch_size=2,
        max_length=24,
        held_out_rows=4,
        fit_rows=4,
        chat_prompts=24,
        answer_tokens=3,
        churn_prompts=2,
        prose_file=str(root / "sonnets.txt"),
        seeds=[0, 1],
        work=str(root / "work"),
        records=str(root / "records"),
    )
    experiment = experiment_class(settings)
    write_experiment_plan(experiment, root / "results")
    make_runs(experiment, run_keys(experiment))
    _, results = analyse(experiment, root / "results", root / "protocol")
    return settings, results


@pytest.fixture(scope="module")
def micro(tiny_kit, tmp_path_factory):
    """(the settings, the results) of the micro experiment, its two seeds made and analysed."""
    rates = {"lora": [1e-1, 1.0], "atlas": [1e-1, 1.0], "norm_matched": [1.0], "lora_output_kl": [1e-1]}
    root, model = tmp_path_factory.mktemp("real-atlas-compare"), tiny_kit.model_dir("llama")
    return made_and_analysed(RealAtlasCompare, RealAtlasCompareSettings, root, model, learning_rates=rates)


@pytest.fixture(scope="module")
def micro_second_model(tiny_kit, tmp_path_factory):
    """The second model's design in micro (its methods, one Output-KL rate), on the same tiny model."""
    rates = {"lora": [1e-1, 1.0], "atlas": [1e-1, 1.0], "lora_output_kl": [1e-1]}
    root, model = tmp_path_factory.mktemp("real-atlas-compare-gemma"), tiny_kit.model_dir("llama")
    return made_and_analysed(RealAtlasCompareGemma, RealAtlasCompareGemmaSettings, root, model, learning_rates=rates)


def rows(folder: Path) -> dict[int, dict]:
    """A drift.jsonl's rows merged by step."""
    merged: dict[int, dict] = {}
    for line in (folder / "drift.jsonl").read_text().splitlines():
        row = json.loads(line)
        merged.setdefault(row["step"], {}).update(row)
    return merged


def nll_curve(folder: Path, source: str) -> list[tuple[int, float, float]]:
    """(step, validation target, the source's test NLL per token), logged by --retained_nll."""
    return [(step, row["target"], row[f"test/retained_nll/{source}"]) for step, row in sorted(rows(folder).items())]


def target_curve_on_test(folder: Path) -> list[tuple[int, float, float]]:
    """(step, validation target, test target)."""
    return [(step, row["target"], row["test/target"]) for step, row in sorted(rows(folder).items())]


def curve(folder: Path, split: str) -> list[tuple[int, float, float]]:
    """(step, validation target, drift on `split`): the drift the geometric mean of the three sources' KLs."""
    prefix = "" if split == "validation" else "test/"
    found = []
    for step, row in sorted(rows(folder).items()):
        kls = [max(row[f"{prefix}retained_kl/{source}"], 1e-12) for source in SOURCES]
        found.append((step, row["target"], math.exp(sum(map(math.log, kls)) / 3)))
    return found


def drift_at(validation, test, level) -> float | None:
    """The test drift where the validation target first reaches `level` along its running maximum."""
    envelope = [point for index, point in enumerate(validation) if all(point[1] > p[1] for p in validation[:index])]
    drifts = {step: drift for step, _, drift in test}
    for (step_a, target_a, _), (step_b, target_b, _) in pairwise(envelope):
        if target_a < level <= target_b:
            f = (level - target_a) / (target_b - target_a)
            low, high = drifts[step_a], drifts[step_b]
            if step_a == 0 or low <= 0 or high <= 0:
                return low + f * (high - low)
            return math.exp((1 - f) * math.log(low) + f * math.log(high))
    return drifts[envelope[0][0]] if envelope[0][1] >= level else None


def chosen(folders: list[Path], level: float) -> Path:
    """compare's choice among runs (rates, or Output-KL's strengths), by hand: the least validation drift at
    `level` among the runs that reach it (ties: the first, the lower value), else the highest best score."""
    drifts = {f: drift_at(curve(f, "validation"), curve(f, "validation"), level) for f in folders}
    eligible = [f for f in folders if drifts[f] is not None]
    if eligible:
        return min(eligible, key=lambda f: drifts[f])
    return max(folders, key=lambda f: (max(t for _, t, _ in curve(f, "validation")), -folders.index(f)))


def by_hand(settings, seed: int) -> dict[str, tuple[float | None, float | None]]:
    """Each primary's value for `seed` from its kept drift.jsonl files, every rate and Output-KL's strength chosen
    here too."""
    kept = Path(settings.records) / str(seed)
    value = lambda folder: float(folder.name.split("-", 1)[1])  # noqa: E731
    others = [method for method in settings.methods if method != "atlas"]
    runs = {method: sorted((kept / method).glob("lr-*"), key=value) for method in settings.methods
            if method != "lora_output_kl"}  # fmt: skip
    lora = [curve(folder, "validation") for folder in runs["lora"]]
    start = sum(run[0][1] for run in lora) / len(lora)  # the step-0 score, the same for every rate
    best = max(max(t for _, t, _ in run) for run in lora)
    if best <= start:  # LoRA never gained: no level to compare at
        return {other: (None, None) for other in others}
    selection = start + settings.selection_fraction * (best - start)
    folder = {method: chosen(folders, selection) for method, folders in runs.items()}
    folder["lora_output_kl"] = chosen(sorted(kept.glob("lora_output_kl/*/kl-*"), key=value), selection)
    level = start + PRIMARY_FRACTION * (best - start)
    test = {m: drift_at(curve(f, "validation"), curve(f, "test"), level) for m, f in folder.items()}
    forgot = {m: forgetting(f, level) for m, f in folder.items()}
    gain = {m: change_at(curve(f, "validation"), target_curve_on_test(f), level) for m, f in folder.items()}
    return {
        other: (
            None if test["atlas"] is None or not test[other] else math.log(test["atlas"] / test[other]),
            difference(forgot, other),
            difference(gain, other),
        )
        for other in others
    }


def difference(found: dict[str, float | None], other: str) -> float | None:
    """ATLAS's value minus `other`'s (None when either is missing)."""
    return None if found["atlas"] is None or found[other] is None else found["atlas"] - found[other]


def change_at(validation, values, level: float) -> float | None:
    """A logged value where the validation target first reaches `level` (read between the same checkpoints as the
    drift) minus its step-0 value."""
    at = drift_at(validation, values, level)
    return None if at is None else at - values[0][2]


def forgetting(folder: Path, level: float) -> float | None:
    """PEFT's forgetting figure by hand: per source, the test NLL where the validation target first reaches `level`
    (read between the same checkpoints as the drift) minus the step-0 NLL; the mean over the sources."""
    found = [change_at(curve(folder, "validation"), nll_curve(folder, source), level) for source in SOURCES]
    return None if None in found else sum(found) / len(found)


@pytest.mark.parametrize("made", ["micro", "micro_second_model"])
def test_the_primaries_recompute_by_hand_from_the_kept_drift_logs(made, request):
    settings, results = request.getfixturevalue(made)
    names = ("50%: atlas vs {}, log drift ratio", "50%: atlas - {}, forgetting", "50%: atlas - {}, test gain")
    for index, seed in enumerate(settings.seeds):
        for other, values in by_hand(settings, seed).items():
            for name, value in zip(names, values):
                found = results["endpoints"][name.format(other)]["per_unit"][index]
                assert (found is None) == (value is None), (seed, name.format(other))
                if value is not None:  # the results round to 6 places
                    assert found == pytest.approx(value, abs=1e-6), (seed, name.format(other))
    assert any(None not in values for seed in settings.seeds for values in by_hand(settings, seed).values())


def test_every_run_is_compares_own_planned_run_and_a_rerun_trains_nothing(micro, monkeypatch):
    settings, _ = micro
    for seed in settings.seeds:
        plan = json.loads((Path(settings.work) / f"seed-{seed}" / "main" / "plan.json").read_text())
        assert plan["preceded_runs"] and plan["settings"]["test_split"] == "test"
        assert plan["primaries"] == ["atlas vs lora at 25% of lora's gain", "norm_matched vs lora at 25% of lora's "
                                     "gain", "atlas vs lora at 50% of lora's gain",
                                     "norm_matched vs lora at 50% of lora's gain"]  # fmt: skip
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "train", lambda *a, **k: pytest.fail("a kept run was trained again"))
    experiment = RealAtlasCompare(settings)
    assert [record["seed"] for record in make_runs(experiment, run_keys(experiment))] == settings.seeds


class Stopped(Exception):
    """The process stopped (a session's end) after its first run."""


def test_each_run_is_kept_as_it_ends_and_a_new_machine_trains_only_the_rest(micro, tmp_path, monkeypatch):
    """A run is kept in the records the moment it ends; a new machine (an empty work folder) gets it, the arm's plan
    and the chat answers back from the records, trains only the other runs, and the seed's record equals the one an
    uninterrupted process made (every curve; the seconds aside)."""
    from kinfolk.compare.runs import CompareRuns
    from kinfolk.lab.world import heldout

    settings, _ = micro
    again = dataclasses.replace(settings, seeds=[0], work=str(tmp_path / "work"), records=str(tmp_path / "records"))
    train, trained = CompareRuns.train, []

    def stopping(runs, key, folder, step_done):
        if trained:
            raise Stopped
        trained.append(key)
        return train(runs, key, folder, step_done)

    monkeypatch.setattr(CompareRuns, "train", stopping)
    experiment = RealAtlasCompare(again)
    with pytest.raises(Stopped):
        make_runs(experiment, run_keys(experiment))
    first = Path(again.records) / "0" / f"{trained[0].method}/lr-{trained[0].rate}"
    assert json.loads((first / "run.json").read_text())["method"] == trained[0].method

    shutil.rmtree(again.work)
    monkeypatch.setattr(heldout, "greedy_answers", lambda *a: pytest.fail("the kept chat answers were made again"))
    retrained = []
    monkeypatch.setattr(
        CompareRuns, "train", lambda runs, key, *rest: retrained.append(key) or train(runs, key, *rest)
    )
    [record] = make_runs(experiment, run_keys(experiment))
    assert trained[0] not in retrained and len(retrained) == len(record["runs"]) - 1
    assert json.loads((Path(again.work) / "seed-0" / "main" / "plan.json").read_text())["preceded_runs"]

    def curves(made):
        return {name: {**run, "seconds": None} for name, run in made["runs"].items()}

    uninterrupted = json.loads((Path(settings.records) / "0" / "record.json").read_text())
    assert curves(record) == curves(uninterrupted)


def test_the_second_models_plan_is_the_firsts_but_where_its_notes_say():
    first, second = RealAtlasCompare(), RealAtlasCompareGemma()
    one, two = first.plan().settings, second.plan().settings
    assert {name for name in one if one[name] != two[name]} == {
        "model",
        "methods",
        "learning_rates",
        "work",
        "records",
    }
    assert two["methods"] == [m for m in one["methods"] if m != "norm_matched"]  # reduced for cost
    assert all(len(two["learning_rates"][m]) == 2 for m in ("lora", "atlas"))  # chosen per seed on validation
    assert {**first.settings.compare_options(), "use_cpu": False} == second.settings.compare_options()
    claims = [primary.claim for primary in second.primaries()]
    assert [p.name for p in second.primaries()] == [p.name for p in first.primaries() if "norm_matched" not in p.name]
    assert all("on Gemma-3-270m (base) learning Python code" in claim.if_shown for claim in claims)
    assert {key: rule for key, rule in first.selection_rules().items() if key != "learning rates"} == {
        key: rule for key, rule in second.selection_rules().items() if key != "learning rates"
    }


def test_a_seed_whose_first_draw_leaves_a_split_short_is_drawn_again_and_one_that_filled_keeps_it(monkeypatch):
    from kinfolk.lab.methods.real_atlas_compare import data

    sizes = [2, 2, 3, 2, 3, 2, 2, 2, 2, 3]
    items = {f"g{group}#{index}": "" for group, size in enumerate(sizes) for index in range(size)}
    first, again = {}, {seed: data.deal(items, seed, held_out=5) for seed in range(40)}
    monkeypatch.setattr(data, "DRAWS", 1)
    for seed in again:
        with contextlib.suppress(ValueError):
            first[seed] = data.deal(items, seed, held_out=5)
    assert 0 < len(first) < len(again)  # some first draws fell short, some filled
    assert all(first[seed] == again[seed] for seed in first)
    for folds in again.values():
        assert len(folds["validation"]) == len(folds["test"]) == 5
        in_split = [{data.group_of(name) for name in folds[split]} for split in data.SPLITS]
        assert not (in_split[0] & in_split[1] or in_split[0] & in_split[2] or in_split[1] & in_split[2])


@pytest.mark.parametrize("held", ["main", "first strength"])
def test_a_process_trains_the_next_strength_while_another_holds_an_arm(held):
    """The main arm and Output-KL's strengths of a round are independent once the LoRA run is kept: while another
    process holds one of them (its arm answers None), this process goes on to the others instead of waiting, and the
    seed is not whole yet."""
    from kinfolk.lab.methods.real_atlas_compare.runs import RealAtlasCompareRuns

    settings = RealAtlasCompareSettings()
    held_coef = None if held == "main" else settings.output_kl_coefs[0]

    class HeldElsewhere(RealAtlasCompareRuns):
        def arm(self, seed, coef=None):
            tried.append(coef)
            return None if coef == held_coef else {}

    tried = []
    assert HeldElsewhere(settings).arms(0) is None
    assert tried == [None, *settings.output_kl_coefs]
