"""The real-boomerang experiment in micro on a tiny model: its sizes are `merge patch`'s, its measurement is
cross-entropy and KL as written by hand, two seeds run through the protocol's runner, and the command reads them
back and draws their curves."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from adapt_helpers import distilled_copy, init_student
from lab_helpers import no_training
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.lab.experiments.real_boomerang.experiment import RealBoomerang
from kinfolk.lab.experiments.real_boomerang.figure import plot_curves
from kinfolk.lab.experiments.real_boomerang.settings import BoomerangSettings
from kinfolk.lab.methods.adapt.size_curves import SharedPrefixes, measure_size, patched_sizes, size_value
from kinfolk.lab.methods.selection import depth_concordance
from kinfolk.lab.protocol.plan import write_plan
from kinfolk.lab.protocol.runner import run_experiment
from kinfolk.lab.world.heldout import TeacherReference, rows_from
from kinfolk.plugins.adapt import merge


@pytest.fixture(scope="module")
def micro(tiny_kit, tmp_path_factory):
    root = tmp_path_factory.mktemp("boomerang")
    return BoomerangSettings(
        model=str(tiny_kit.model_dir("llama", "large")), layers={"every": 2}, seeds=[0, 1], steps=2, batch_size=2, max_length=128,
        heldout_rows_per_source=2, chat_prompts=12, answer_tokens=4, work=str(root / "work"),
        records=str(root / "records"),
    )  # fmt: skip


def test_a_size_built_in_memory_is_the_one_merge_patch_writes(micro, tmp_path):
    teacher = micro.teacher_dir()
    student = merge({"op": "init-student", "teacher": str(teacher), "layers": {"every": 2, "last": 1}},
                    tmp_path / "student", progress=False)  # fmt: skip
    written = merge({"op": "patch", "teacher": str(teacher), "student": str(student), "order": "back-to-front",
                     "num_patched": 1}, tmp_path / "k1", progress=False)  # fmt: skip
    sizes = list(patched_sizes(teacher, student, "back-to-front"))
    assert [s["k"] for s, _ in sizes] == [0, 1, 2, 3] and [s["depth"] for s, _ in sizes] == [3, 3, 3, 4]
    ids = torch.tensor([[5, 9, 17, 33, 60, 2]])
    expected = AutoModelForCausalLM.from_pretrained(written).eval()(ids).logits
    assert torch.equal(sizes[1][1](ids).logits, expected)
    # every block patched back is the teacher itself
    assert torch.equal(sizes[-1][1](ids).logits, AutoModelForCausalLM.from_pretrained(teacher).eval()(ids).logits)


def test_measurement_is_cross_entropy_and_kl_by_hand(micro, tiny_kit):
    tokenizer = AutoTokenizer.from_pretrained(micro.teacher_dir())
    teacher = AutoModelForCausalLM.from_pretrained(micro.teacher_dir()).eval()
    other = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama", "large", seed=1)).eval()
    texts = ["def add(a, b):\n    return a + b\n", "the quick brown fox jumps"]
    rows = rows_from("code", tokenizer, texts, ["def add", texts[1][:3]], max_length=32)
    reference = TeacherReference(teacher, [rows])
    assert reference.measure(teacher)["code"].kl == pytest.approx(0.0, abs=1e-7)
    measured = reference.measure(other)["code"]
    nll = kl = 0.0
    count = agree = 0
    with torch.no_grad():
        for text, prefix in zip(texts, ["def add", texts[1][:3]]):
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            start = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
            ours = F.log_softmax(other(ids).logits[0, start - 1 : -1].double(), -1)
            theirs = F.log_softmax(teacher(ids).logits[0, start - 1 : -1].double(), -1)
            targets = ids[0, start:]
            nll += F.nll_loss(ours, targets, reduction="sum").item()
            kl += F.kl_div(ours, theirs, log_target=True, reduction="sum").item()
            agree += (ours.argmax(-1) == targets).sum().item()
            count += len(targets)
    assert measured.nll == pytest.approx(nll / count, rel=1e-5)
    assert measured.kl == pytest.approx(kl / count, rel=1e-4)
    assert measured.agreement == agree / count


@pytest.mark.parametrize("architecture", ["llama", "gemma2"])  # gemma2: per-layer attention types, scaled embeddings
def test_sizes_measured_from_shared_prefixes_give_the_full_forwards_numbers(tiny_kit, tmp_path, architecture):
    teacher_dir = tiny_kit.model_dir(architecture, "large")  # 4 layers; the student keeps 0, 2, 3
    init = init_student(teacher_dir, tmp_path / "init", every=2, last=1)
    student_dir = distilled_copy(init, tmp_path / "student", tiny_kit.tokenizer(), seed=3, scale=0.05)
    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    texts = ["def add(a, b):\n    return a + b\n" * 3, "the quick brown fox jumps over the lazy dog " * 4] * 3
    rows = rows_from("code", tokenizer, texts, None, max_length=40)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    reference = TeacherReference(teacher, [rows])
    prefixes = (SharedPrefixes(teacher, reference),
                SharedPrefixes(AutoModelForCausalLM.from_pretrained(student_dir), reference))  # fmt: skip
    # front to back a size starts with the teacher's blocks, back to front with the student's layers
    expected_layers = {"front-to-back": [2, 2, 3, 3], "back-to-front": [2, 2, 1, 3]}
    for order, layers in expected_layers.items():
        for (_, model), layer in zip(patched_sizes(teacher_dir, student_dir, order), layers, strict=True):
            shared, used = measure_size(model, reference, prefixes)
            full = reference.measure(model)["code"]
            assert used == layer
            assert shared["code"].nll == pytest.approx(full.nll, rel=1e-6, abs=1e-9)
            assert shared["code"].kl == pytest.approx(full.kl, rel=1e-5, abs=1e-9)
            assert shared["code"].agreement == full.agreement
    one_layer = init_student(teacher_dir, tmp_path / "one-layer", every=4)
    assert SharedPrefixes(AutoModelForCausalLM.from_pretrained(one_layer), reference).caches == {}


@pytest.fixture(scope="module")
def results(micro, tmp_path_factory):
    """Two micro seeds through the protocol's runner, under a plan written as `plan` writes it."""
    tmp_path = tmp_path_factory.mktemp("protocol")
    experiment = RealBoomerang(micro)
    plan = tmp_path / "real-boomerang.plan.json"
    write_plan(experiment.plan(), plan)
    return run_experiment(experiment, plan, tmp_path / "work")


def test_two_micro_seeds_run_through_the_protocol(micro, results, tmp_path):
    assert results["unit_kind"] == "seed" and results["units"] == [0, 1]
    kept = [json.loads((Path(micro.records) / f"{seed}.json").read_text()) for seed in (0, 1)]
    # the undistilled arm does not depend on the seed; the distilled one does
    assert kept[0]["test"]["undistilled"] == kept[1]["test"]["undistilled"]
    assert kept[0]["test"]["distilled"] != kept[1]["test"]["distilled"]
    endpoint = results["endpoints"]["distilled: log-ppl concordance with depth"]
    for seed, value in zip((0, 1), endpoint["per_unit"]):
        curves = kept[seed]["test"]["distilled"]
        by_order = [depth_concordance([p["depth"] for p in points[:-1]], [size_value(p, "nll") for p in points[:-1]],
                                      higher_is_better=False) for points in curves.values()]  # fmt: skip
        assert value == pytest.approx(sum(by_order) / 2, abs=1e-6)
    middle = results["endpoints"]["middle size: log-ppl, undistilled - distilled"]
    assert middle["per_unit"][0] == pytest.approx(middle["absolute"]["baseline"][0] - middle["absolute"]["method"][0])
    assert all(entry["ci95"] is None for entry in results["endpoints"].values())  # 2 seeds: values, no interval
    assert plot_curves(kept, tmp_path / "curves.png").stat().st_size > 0


def test_the_command_reads_the_kept_seeds_back_and_draws_their_curves(micro, results, tmp_path, monkeypatch, capsys):
    from kinfolk.commands import main

    monkeypatch.setattr(RealBoomerang, "settings_class", staticmethod(lambda: micro))
    monkeypatch.chdir(tmp_path)
    with no_training():
        assert main(["lab", "experiment", "real-boomerang", "run", "--figure", "curves.png"]) == 0
    out = capsys.readouterr().out
    assert f"real-boomerang: 2 records kept in {micro.records}" in out and "curves: curves.png" in out
    assert (tmp_path / "curves.png").stat().st_size > 0
