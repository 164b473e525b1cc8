"""The real-atlas experiment in micro on a tiny model: its splits are disjoint, its methods train as many parameters,
its selection follows the written rule on validation, its endpoints are the test numbers of what was chosen, and a
kept adapter reloads with `PeftModel.from_pretrained` to the KL its record reports (recomputed by hand), and the
command reads the kept seeds back and draws their curves."""

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lab_helpers import RESULTS, ROOT, no_training
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.lab.experiments.real_atlas import corpus
from kinfolk.lab.experiments.real_atlas.experiment import RealAtlas
from kinfolk.lab.experiments.real_atlas.figure import plot_curves
from kinfolk.lab.experiments.real_atlas.settings import RealAtlasSettings
from kinfolk.lab.methods import selection
from kinfolk.lab.protocol.plan import write_plan
from kinfolk.lab.protocol.runner import run_experiment


def roman(number: int) -> str:
    digits = [(50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = ""
    for value, letters in digits:
        while number >= value:
            out, number = out + letters, number - value
    return out


@pytest.fixture(scope="module")
def micro(tiny_kit, tmp_path_factory):
    root = tmp_path_factory.mktemp("real-atlas")
    prose = root / "sonnets.txt"
    prose.write_text("".join(f"{n}\n  the {i}th verse of love\n  and time that passes by\n" for i, n in enumerate(map(roman, range(1, 61))))
                     + "THE END\n")  # fmt: skip
    return RealAtlasSettings(
        model=str(tiny_kit.model_dir("llama", "large")), rank=2, seeds=[0, 1], steps=2, checkpoint_every=1,
        batch_size=2, max_length=48, code_rows=2, retained_rows=1, fit_rows=2, chat_prompts=40, answer_tokens=4,
        prose_file=str(prose), work=str(root / "work"), records=str(root / "records"),
        learning_rates={"lora": 1e-2, "atlas": 1e-2, "norm-matched": 1e-2, "osf": 1e-3, "lora+output-kl": 1e-2},
    )  # fmt: skip


@pytest.fixture(scope="module")
def results(micro, tmp_path_factory):
    experiment = RealAtlas(micro)
    plan = tmp_path_factory.mktemp("plan") / "real-atlas.plan.json"
    write_plan(experiment.plan(**experiment.plan_fields()), plan)
    return run_experiment(experiment, plan, tmp_path_factory.mktemp("protocol"))


def _record(micro, seed: int) -> dict:
    return json.loads((Path(micro.records) / str(seed) / "record.json").read_text())


def test_no_item_is_in_two_splits_and_a_module_stays_in_one(micro):
    sources = corpus.text_sources(micro.prose_path())
    for seed in (0, 1):
        draw = corpus.draw(sources, seed)
        for source, by_split in draw.names.items():
            seen = [set(names) for names in by_split.values()]
            assert sum(map(len, seen)) == len(sources[source]) == len(set().union(*seen))
        modules = {split: {n.split("#")[0] for n in names} for split, names in draw.names["code"].items()}
        assert not modules["train"] & modules["test"] and not modules["train"] & modules["validation"]
    assert corpus.draw(sources, 0).names != corpus.draw(sources, 1).names  # each seed resamples the splits


def test_selection_on_hand_made_runs():
    def run(*points):
        return [{"step": step, "gain": gain, "kl": {"a": kl, "b": kl * 4}} for step, gain, kl in points]

    slow = run((0, 0.0, 0.0), (12, 0.1, 0.001), (24, 0.3, 0.004))
    fast = run((0, 0.0, 0.0), (12, 0.3, 0.010), (24, 0.5, 0.020))
    assert selection.drift(slow[1]) == pytest.approx(0.002)  # geometric mean of 0.001 and 0.004
    assert selection.levels({"high": 0.5}, fast) == {"high": 0.25}
    assert selection.checkpoint_at(fast, 0.25) == 12 and selection.checkpoint_at(slow, 0.25) == 24
    assert selection.choose_run({"slow": slow, "fast": fast}, 0.25) == "slow"  # 0.008 < 0.02 at the level
    assert selection.choose_run({"slow": slow, "fast": fast}, 0.6) == "fast"  # none reaches: the farthest
    assert selection.pilot_level({"slow": slow, "fast": fast}, 0.5) == 0.25  # of the best gain any run reaches


def test_methods_train_matched_parameters(micro, results):
    runs = _record(micro, 0)["runs"]
    hidden = AutoModelForCausalLM.from_pretrained(micro.model_dir()).config.hidden_size
    lora = 2 * micro.rank * hidden
    assert {m: runs[m]["trainable"] for m in ("lora", "atlas", "norm-matched", "lora+output-kl")} == dict.fromkeys(
        ("lora", "atlas", "norm-matched", "lora+output-kl"), lora
    )
    assert runs["osf"]["trainable"] == lora + micro.rank  # U, V and the r singular values


def test_endpoints_are_the_test_numbers_of_the_validation_choice(micro, results, tmp_path):
    assert results["unit_kind"] == "seed" and results["units"] == [0, 1]
    experiment = RealAtlas(micro)
    for index, seed in enumerate((0, 1)):
        record = _record(micro, seed)
        runs = record["runs"]
        validation = {m: [{"step": p["step"], **p["validation"]} for p in r["points"]] for m, r in runs.items()}
        top = max(p["gain"] for p in validation["lora"] if p["step"] > 0)
        level = micro.gain_levels["high"] * top
        for other in ("lora", "norm-matched", "lora+output-kl", "osf"):
            steps = {}
            for method in ("atlas", other):
                reaching = [p for p in validation[method] if p["step"] > 0 and p["gain"] >= level]
                best = min(reaching, key=lambda p: math.prod(p["kl"].values()), default=None)
                steps[method] = None if best is None else best["step"]
            entry = results["endpoints"][f"high: atlas vs {other}, log drift ratio"]
            if None in steps.values():
                assert entry["per_unit"][index] is None
                continue
            ours, theirs = (
                next(p["test"]["kl"] for p in runs[method]["points"] if p["step"] == steps[method])
                for method in ("atlas", other)
            )
            expected = sum(math.log(ours[s] / theirs[s]) for s in corpus.RETAINED_SOURCES) / 3
            assert entry["per_unit"][index] == pytest.approx(expected, abs=1e-5)
    assert set(results["endpoints"]) >= {e.name for e in experiment.primaries()}
    assert all(entry["ci95"] is None for entry in results["endpoints"].values())  # 2 seeds: values, no interval
    assert plot_curves([_record(micro, 0), _record(micro, 1)], tmp_path / "curves.png").stat().st_size > 0


def recomputed_kl(model_dir, adapter_dir, contexts: dict, source: str, max_length: int) -> float:
    """KL(frozen || adapted) per token on a source's test rows, in float64 from the reloaded adapter."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    frozen = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter_dir).eval()
    total = count = 0.0
    for row in contexts[f"test/{source}"]:
        ids = torch.tensor([tokenizer(row["text"], add_special_tokens=False)["input_ids"][:max_length]])
        start = len(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]) if "prompt" in row else 1
        with torch.no_grad():
            ours = F.log_softmax(adapted(ids).logits[0, start - 1 : -1].double(), -1)
            theirs = F.log_softmax(frozen(ids).logits[0, start - 1 : -1].double(), -1)
        total += F.kl_div(ours, theirs, log_target=True, reduction="sum").item()
        count += ids.shape[1] - start
    return total / count


def check_kept_adapter(settings: RealAtlasSettings, seed: int, level: str, methods) -> None:
    """The first of `methods` with a checkpoint at `level` reloads to the test KL its record reports."""
    units = Path(settings.records) / str(seed)
    record = json.loads((units / "record.json").read_text())
    chosen = RealAtlas(settings).select(record)["checkpoints"][level]
    method = next(m for m in methods if chosen[m] is not None)
    point = next(p for p in record["runs"][method]["points"] if p["step"] == chosen[method])
    contexts = json.loads((units / "contexts.json").read_text())
    for source in corpus.RETAINED_SOURCES:
        kl = recomputed_kl(settings.model_dir(), units / "adapters" / f"{level}-{method}", contexts, source,
                           settings.max_length)  # fmt: skip
        # the record's KL comes from fp32 log-probabilities: about 1e-7 nats off per position at most
        assert point["test"]["kl"][source] == pytest.approx(kl, rel=1e-3, abs=1e-7)
        assert kl > 1e-6  # the adapter did move this source: the check above is not of zeros


def test_a_kept_adapter_reloads_to_the_kl_its_record_reports(micro, results):
    check_kept_adapter(micro, 0, "high", ("atlas", "lora"))  # LoRA always reaches its own level


def test_a_run_claimed_by_a_live_process_is_left_to_it_and_a_dead_ones_claim_is_taken_over(tmp_path):
    import subprocess

    from kinfolk.atomic import current_writer
    from kinfolk.claims import claimed

    # this process holds it and is alive: a second claim waits its turn
    with claimed(tmp_path) as first, claimed(tmp_path) as second:
        assert (first, second) == (True, False)
    assert not (tmp_path / "claimed-by").exists()  # released
    finished = subprocess.Popen(["true"])  # once reaped, its pid names no live process
    finished.wait()
    dead = dataclasses.replace(current_writer(), pid=finished.pid, start=0)
    (tmp_path / "claimed-by").write_text(json.dumps(dataclasses.asdict(dead)))
    with claimed(tmp_path) as taken:
        assert taken and json.loads((tmp_path / "claimed-by").read_text())["pid"] == os.getpid()
    (tmp_path / "claimed-by").write_text("")  # a claim being written: its holder is alive
    with claimed(tmp_path) as ours:
        assert not ours


def test_the_command_reads_the_kept_seeds_back_and_draws_their_curves(micro, results, tmp_path, monkeypatch, capsys):
    from kinfolk.commands import main

    monkeypatch.setattr(RealAtlas, "settings_class", staticmethod(lambda: micro))
    monkeypatch.chdir(tmp_path)
    with no_training():
        assert main(["lab", "experiment", "real-atlas", "run", "--seeds", "1", "0", "--figure", "curves.png"]) == 0
    out = capsys.readouterr().out
    assert f"real-atlas: 2 records kept in {micro.records}" in out and "curves: curves.png" in out
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_the_plan_holds_the_pilots_choices_which_follow_its_rule():
    pilot = json.loads((RESULTS / "real-atlas-units" / "pilot.json").read_text())
    settings = json.loads((RESULTS / "real-atlas.plan.json").read_text())["settings"]
    assert settings["learning_rates"] == pilot["learning_rates"]
    assert settings["output_kl_coef"] == pilot["output_kl_coef"]
    assert pilot["seed"] not in settings["seeds"]  # the pilot is not a unit
    by_method: dict = {}
    for name, run in pilot["runs"].items():
        by_method.setdefault(run["method"], {})[name] = run["validation"]
    lora = max(by_method["lora"], key=lambda n: max(p["gain"] for p in by_method["lora"][n]))
    level = settings["gain_levels"]["high"] * max(p["gain"] for p in by_method["lora"][lora])
    assert pilot["level"]["validation_gain"] == pytest.approx(level)
    for method, named in by_method.items():
        if method == "lora":
            continue

        # by hand: the lowest geometric-mean KL among checkpoints reaching the level, else the farthest-reaching run
        def drift_at(points):
            reaching = [math.prod(p["kl"].values()) for p in points if p["step"] > 0 and p["gain"] >= level]
            return min(reaching, default=None)

        reaching = {n: drift_at(points) for n, points in named.items() if drift_at(points) is not None}
        expected = (
            min(reaching, key=reaching.get) if reaching else max(named, key=lambda n: max(p["gain"] for p in named[n]))
        )
        assert pilot["runs"][expected]["learning_rate"] == pilot["learning_rates"][method]
        if method == "lora+output-kl":
            assert pilot["runs"][expected]["strength"] == pilot["output_kl_coef"]


@pytest.mark.real
def test_a_committed_adapter_reloads_on_the_real_model_to_its_recorded_kl(real_model_dir, monkeypatch):
    monkeypatch.chdir(ROOT)
    settings = RealAtlas().settings
    real_model_dir(settings.model)
    check_kept_adapter(settings, settings.seeds[0], "high", ("atlas", "lora"))
