"""atlas-controls: the drift sources (disjoint splits, none the atlas's fitting data), one micro family through the
protocol's runner (every method and grid point, step-0 floors of identity adapters, choices and endpoints
recomputed by hand from the record)."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from lab_helpers import MICRO, run_micro

from kinfolk.lab.experiments.atlas_controls.experiment import AtlasControls
from kinfolk.lab.experiments.atlas_controls.runs import AtlasControlsRuns
from kinfolk.lab.experiments.atlas_controls.settings import OTHER_SOURCES, SOURCES, ControlsSettings
from kinfolk.lab.experiments.atlas_controls.sources import source_rows
from kinfolk.lab.methods.atlas.runs import run_name
from kinfolk.lab.protocol.views import SelectionView


def test_sources_share_nothing_across_splits_and_nothing_with_the_atlas_fit():
    from kinfolk.lab.world import corpus
    from kinfolk.lab.world.skills import FORMATS

    fit_prompts = set(corpus.ideal_dataset(["copy"], 512, seed=3)["prompt"])  # the family's retained train rows
    for source in SOURCES:
        validation, test = (source_rows(source, 64, seed=3, split=split) for split in ("validation", "test"))
        keys = [set(zip(rows["prompt"], rows["completion"])) for rows in (validation, test)]
        assert not keys[0] & keys[1], source
        assert not set(validation["prompt"]) & fit_prompts - {""}, source
        assert not set(test["prompt"]) & fit_prompts - {""}, source
    formats = source_rows("copy-formats", 8, seed=3, split="test")["completion"]
    assert all(c.startswith(" ") or c.startswith("[") for c in formats) and FORMATS[0] == "{}"
    assert all(p == "" for p in source_rows("text", 8, seed=3, split="test")["prompt"])


def micro_settings(tmp_path: Path) -> ControlsSettings:
    return ControlsSettings(
        families=[0],
        runs=1,
        targets=["reverse"],
        learning_rates=[1e-3, 1e-2],
        ablation_learning_rates=[1e-2],
        osf_learning_rates=[1e-2],
        output_kl_coefs=[1.0],
        replay_ratios=[0.1],
        steps=2,
        checkpoint_every=1,
        validation_problems=4,
        eval_problems=4,
        kl_contexts=4,
        work=str(tmp_path / "work"),
        records=str(tmp_path / "records"),
        family_overrides=MICRO,
    )


@pytest.fixture(scope="module")
def micro_run(lab_cache_dir, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("atlas-controls")
    experiment = AtlasControls(micro_settings(tmp_path))
    record, results = run_micro(experiment, lab_cache_dir, tmp_path)
    return experiment, record, results, tmp_path


def test_micro_family_runs_every_method_and_grid_point_with_identity_floors(micro_run):
    experiment, record, _, _ = micro_run
    settings = experiment.settings
    runs = record["targets"]["reverse"]
    expected = {run_name(m, rate, strength) for m in settings.methods for rate, strength in settings.runs_of(m)}
    assert set(runs) == expected
    for name, run in runs.items():
        assert [p["step"] for p in run["points"]] == [0, 1, 2], name
        for point in run["points"]:
            assert set(point["validation"]["kl"]) == set(point["test"]["kl"]) == set(SOURCES)
    for method in ("lora", "atlas", "norm-matched", "lora+output-kl"):  # B = 0 at the start: the frozen model
        zero = runs[run_name(method, *settings.runs_of(method)[0])]["points"][0]["test"]["kl"]
        assert max(abs(v) for v in zero.values()) < 1e-6, (method, zero)


def synthetic_record(settings: ControlsSettings, seed: int = 0) -> dict:
    """Random checkpoints (targets 0.2-0.95, KLs 1e-3-1e-1) after an identity step 0 (KL 1e-9)."""
    rng = np.random.default_rng(seed)
    runs = {}
    for method in settings.methods:
        for rate, strength in settings.runs_of(method):
            points = [{"step": 0, **{s: {"target": f, "kl": dict.fromkeys(SOURCES, 1e-9)} for s, f in FROZEN.items()}}]
            for step in (10, 20):
                points.append({"step": step, **{
                    split: {"target": float(rng.uniform(0.2, 0.95)),
                            "kl": {src: float(10 ** rng.uniform(-3, -1)) for src in SOURCES}}
                    for split in FROZEN}})  # fmt: skip
            runs[run_name(method, rate, strength)] = {"points": points}
    return {"targets": {"reverse": runs}}


FROZEN = {"validation": 0.2, "test": 0.25}


@pytest.mark.parametrize("seed", range(4))
def test_choices_and_endpoints_recomputed_by_hand(seed):
    settings = dataclasses.replace(micro_settings(Path("/nonexistent")), learning_rates=[1e-3, 1e-2, 3e-2])
    experiment = AtlasControls(settings)
    record = synthetic_record(settings, seed)
    chosen = experiment.select(SelectionView(record))["reverse"]
    values = experiment.analyse(record, {"reverse": chosen})
    runs = record["targets"]["reverse"]

    def drift(kl, sources=OTHER_SOURCES):
        return math.exp(sum(math.log(kl[s]) for s in sources) / len(sources))

    best = max(p["validation"]["target"] for n, r in runs.items() if n.startswith("lora-") for p in r["points"]) - 0.2
    high = 0.2 + 0.75 * best
    assert chosen["levels"]["high"] == pytest.approx(high)
    test_at = {}
    for method in settings.methods:
        candidates = []
        for order, (rate, strength) in enumerate(settings.runs_of(method)):
            name = run_name(method, rate, strength)
            for p in runs[name]["points"]:
                if p["step"] > 0 and p["validation"]["target"] >= high:
                    candidates.append((drift(p["validation"]["kl"]), order, p["step"], name, p["test"]))
        pick = min(candidates, key=lambda c: c[:3]) if candidates else None
        assert chosen["checkpoints"]["high"][method] == (None if pick is None else {"run": pick[3], "step": pick[2]})
        test_at[method] = None if pick is None else pick[4]
    for other in ("lora", "norm-matched", "lora+output-kl"):
        value = values[f"reverse/high: atlas vs {other}, log drift ratio"]
        if test_at["atlas"] is None or test_at[other] is None:
            assert value.value is None
            continue
        a, b = drift(test_at["atlas"]["kl"]), drift(test_at[other]["kl"])
        assert value.value == pytest.approx(math.log(a / b)) and (value.method, value.baseline) == pytest.approx(
            (a, b)
        )
        on_copy = values[f"reverse/high: atlas vs {other}, log KL ratio on copy"]
        assert on_copy.value == pytest.approx(math.log(test_at["atlas"]["kl"]["copy"] / test_at[other]["kl"]["copy"]))
        gain = values[f"reverse/high: atlas - {other}, test gain"]
        assert gain.value == pytest.approx(test_at["atlas"]["target"] - test_at[other]["target"])
    assert values["reverse: floor on add"].value == pytest.approx(1e-9)


def test_a_ratio_near_the_floor_is_left_undefined():
    settings = micro_settings(Path("/nonexistent"))
    experiment = AtlasControls(settings)
    record = synthetic_record(settings, 0)
    for run in record["targets"]["reverse"].values():  # every untrained adapter drifts as much as a trained one
        run["points"][0]["test"]["kl"] = dict.fromkeys(SOURCES, 1e-2)
    chosen = experiment.select(SelectionView(record))
    values = experiment.analyse(record, chosen)
    defined = [v for name, v in values.items() if "log drift ratio" in name and v.method is not None]
    assert defined and all(v.value is None for v in defined)


def test_a_kept_record_is_read_back_without_training(micro_run, lab_cache_dir, monkeypatch):
    experiment, record, _, tmp_path = micro_run
    monkeypatch.setenv("KINFOLK_LAB_CACHE", str(lab_cache_dir))

    def refuse(*args, **kwargs):
        raise AssertionError("a kept run was trained again")

    monkeypatch.setattr("kinfolk.lab.methods.atlas.runs.train_run", refuse)
    elsewhere = dataclasses.replace(experiment.settings, records=str(tmp_path / "records-again"))
    assert AtlasControlsRuns(elsewhere).record(0, 0) == record
