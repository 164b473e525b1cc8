"""Real-boomerang version 2 in micro on a tiny model: its two trained arms differ only in the distillation terms'
weights (same rows, steps and schedule), each seed measures its own draw of held-out rows, and the endpoints are
the curve statistics recomputed here from the kept records."""

import json
from pathlib import Path

import pytest
from lab_helpers import no_training, run_recording_trainings

from kinfolk.lab.experiments.real_boomerang_controls.experiment import RealBoomerangControls
from kinfolk.lab.experiments.real_boomerang_controls.settings import RealBoomerangControlsSettings
from kinfolk.lab.methods.adapt.size_curves import ORDERS, size_value
from kinfolk.lab.protocol.views import SelectionView


@pytest.fixture(scope="module")
def micro(tiny_kit, tmp_path_factory):
    root = tmp_path_factory.mktemp("boomerang-controls")
    return RealBoomerangControlsSettings(
        model=str(tiny_kit.model_dir("llama", "large")), layers={"every": 2}, patched_blocks=2, steps=2, batch_size=2,
        max_length=64, measured_rows_per_source=3, measured_length=96, chat_prompts=48, answer_tokens=4,
        seeds=[0, 1], work=str(root / "work"), records=str(root / "records"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(micro, tmp_path_factory):
    """Two micro seeds through the protocol's runner, with what each training call was given."""
    return run_recording_trainings(RealBoomerangControls(micro), tmp_path_factory.mktemp("protocol"))


def kept(micro, seed: int) -> dict:
    return json.loads((Path(micro.records) / f"{seed}.json").read_text())


def test_the_two_trained_arms_differ_only_in_the_distillation_terms(trained):
    calls, _ = trained
    for seed in (0, 1):
        distilled, ce_only = (c for c in calls if c["args"].seed == seed)
        assert (distilled["out"], ce_only["out"]) == ("distilled", "ce-only")
        assert distilled["rows"] == ce_only["rows"]  # the same rows in the same order
        assert (ce_only["args"].kl_weight, ce_only["args"].cosine_weight) == (0.0, 0.0)
        assert distilled["args"].kl_weight == 0.1 and distilled["args"].cosine_weight is None  # ADAPT's defaults
        for field in ("max_steps", "learning_rate", "lr_scheduler_type", "pretraining_fraction", "data_seed"):
            assert getattr(distilled["args"], field) == getattr(ce_only["args"], field), field


def test_each_seed_measures_its_own_rows_and_every_arm_on_them(micro, trained):
    records = [kept(micro, seed) for seed in (0, 1)]
    assert records[0]["measured"] != records[1]["measured"]
    assert all(len(names) == 3 for r in records for names in r["measured"].values())
    # the untrained student is one model, but measured on each seed's rows its curve differs by seed
    assert records[0]["test"]["undistilled"] != records[1]["test"]["undistilled"]
    for record in records:
        assert list(record["test"]) == ["distilled", "ce-only", "undistilled"]
        curves = record["test"]["distilled"]
        assert [p["k"] for p in curves[ORDERS[0]]] == [0, 1, 2]
        for arm in record["test"].values():  # k = M is the teacher itself in every arm: KL 0
            assert all(size_value(arm[order][-1], "kl") == pytest.approx(0, abs=1e-6) for order in ORDERS)


def test_the_endpoints_are_the_curve_statistics_of_the_kept_records(micro, trained):
    _, results = trained
    experiment = RealBoomerangControls(micro)
    declared = {e.name for e in experiment.primaries()} | {e.name for e in experiment.exploratory()}
    for seed in (0, 1):
        record = kept(micro, seed)
        assert set(experiment.analyse(record, experiment.select(SelectionView(record)))) == declared
        middle = {arm: sum(size_value(c[o][1], "nll") for o in ORDERS) / 2 for arm, c in record["test"].items()}
        endpoint = results["endpoints"]["middle size: log-ppl, ce-only - distilled"]
        assert endpoint["per_unit"][seed] == pytest.approx(middle["ce-only"] - middle["distilled"], abs=1e-6)
        assert endpoint["absolute"]["method"][seed] == pytest.approx(middle["distilled"], abs=1e-6)
        k1 = results["endpoints"]["back-to-front k = 1: log-ppl, undistilled - distilled"]["per_unit"][seed]
        curves = record["test"]
        by_hand = size_value(curves["undistilled"]["back-to-front"][1], "nll") - size_value(
            curves["distilled"]["back-to-front"][1], "nll")  # fmt: skip
        assert k1 == pytest.approx(by_hand, abs=1e-6)


def test_a_rerun_reads_the_kept_arms_back_and_another_student_size_is_refused(micro, trained, tmp_path):
    experiment = RealBoomerangControls(micro)
    with no_training():
        assert experiment.make_run(0, 0) == kept(micro, 0)
    other = RealBoomerangControls(RealBoomerangControlsSettings(**{**micro.__dict__, "patched_blocks": 3}))
    with pytest.raises(ValueError, match="seed 0: 2 patched blocks, the plan has 3"):
        other.analyse(kept(micro, 0), {})


def test_the_process_that_keeps_a_seeds_last_arm_writes_its_record(micro, trained, tmp_path, monkeypatch):
    """Two processes share a seed's arms: this one finds ce-only held by the other, makes the arms after it, and by
    then ce-only is kept; it writes the seed's record at once rather than leaving it to a later pass."""
    import shutil

    from kinfolk.lab.experiments.real_boomerang_controls import runs

    shutil.copytree(micro.work, tmp_path / "work")
    settings = RealBoomerangControlsSettings(
        **{**micro.__dict__, "work": str(tmp_path / "work"), "records": str(tmp_path / "records")}
    )
    kept_arm = runs.RealBoomerangControlsRuns.arm
    held_once = []

    def arm(self, seed, name):
        if name == "ce-only" and not held_once:
            held_once.append(name)
            return None  # the other process holds it on the first look
        return kept_arm(self, seed, name)

    monkeypatch.setattr(runs.RealBoomerangControlsRuns, "arm", arm)
    with no_training():
        record = runs.RealBoomerangControlsRuns(settings).record(0)
    assert held_once == ["ce-only"]
    written = json.loads((tmp_path / "records" / "0.json").read_text())
    assert record == written == kept(micro, 0)
