"""A planned `kinfolk compare` end to end on the tiny Llama (LoRA and ATLAS x 2 rates x 2 seeds, 12 steps measured
every 3), with test splits and two retained sources, checked by hand from its own logs:

- plan.json is written before any run (its primaries: ATLAS against LoRA at each level) and a changed setting is
  refused naming it, before any model loads;
- each checkpoint's drift is the geometric mean of the two sources' KLs, on validation and on test;
- the rates are chosen on the validation curves alone; each verdict finds its point on the validation curve and
  reads the test drift there; its p-value (two seeds: a t-test on one degree of freedom, the Cauchy distribution)
  and the Holm correction over the primaries recompute by hand;
- report.md says the plan preceded the runs, and shows each source's drift.

Then the grid shared by processes: a live process's claim is passed over, a dead one's taken over (`run_grid` with
a stand-in trainer), and two `kinfolk compare` processes on one `--out` train each run once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from compare_helpers import drift_when_reached, geometric_mean, logged_curve, merged_rows, write_splits
from refusal_helpers import assert_command_refused
from two_process_helpers import TIMEOUT, environment

from kinfolk.atomic import Writer, current_writer
from kinfolk.claims import CLAIM_FILE
from kinfolk.commands import main
from kinfolk.compare.grid import RunKey, read_record, run_grid
from kinfolk.compare.measures import Curves
from kinfolk.compare.resume import ResumePoint
from kinfolk.drift import Run

SPLITS = ("train", "validation", "test")
SOURCES = ("prose", "code")
SELECTION_FRACTION, LEVELS, RATES, SEEDS = 0.1, [0.05, 0.1], (0.03, 0.1), (0, 1)  # ATLAS gains slowly


@pytest.fixture(scope="module")
def inputs(tiny_kit, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("planned-inputs")
    return {
        "model": tiny_kit.model_dir("llama", "small"),
        "target": write_splits(root / "target", 0, SPLITS),
        "prose": write_splits(root / "prose", 100, SPLITS),
        "code": write_splits(root / "code", 200, SPLITS),
    }


def planned_argv(inputs, out, *options) -> list[str]:
    return [str(a) for a in [
        "compare", "--model_name_or_path", inputs["model"], "--dataset_name", inputs["target"],
        "--retained_dataset_name", f"prose={inputs['prose']}", f"code={inputs['code']}", "--test_split", "test",
        "--plan", "--out", out, "--use_cpu", "--methods", "lora", "atlas", "--learning_rates", *map(str, RATES),
        "--seeds", *map(str, SEEDS), "--max_steps", "12", "--eval_steps", "3", "--per_device_train_batch_size", "4",
        "--rank", "4", "--atlas_regions", "2", "--atlas_directions", "2", "--selection_fraction",
        str(SELECTION_FRACTION), "--levels", *map(str, LEVELS), *options,
    ]]  # fmt: skip


@pytest.fixture(scope="module")
def planned(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("planned") / "out"
    assert main(planned_argv(inputs, out)) == 0
    return out


def folder(out: Path, method: str, rate: float, seed: int) -> Path:
    return out / "runs" / method / f"lr-{rate:g}" / f"seed-{seed}"


def floored_mean(values) -> float:
    return geometric_mean([max(value, 1e-12) for value in values])


def test_the_plan_precedes_the_runs_and_a_changed_setting_is_refused(inputs, planned, monkeypatch):
    plan = json.loads((planned / "plan.json").read_text())
    assert plan["primaries"] == [f"atlas vs lora at {f:.0%} of lora's gain" for f in LEVELS]
    assert plan["preceded_runs"] is True and plan["settings"]["test_split"] == "test"
    text = (planned / "report" / "report.md").read_text()
    assert f"plan.json {plan['hash']} (written before any run)" in text

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr("kinfolk.compare.runs.AutoModelForCausalLM.from_pretrained", refuse)
    argv = planned_argv(inputs, planned)
    argv[argv.index("--levels") + 2] = "0.2"
    assert_command_refused(argv, planned / "plan.json", "differ from the plan's (levels)")


def test_each_checkpoints_drift_is_the_sources_geometric_mean(planned):
    for method in ("lora", "atlas"):
        for split in ("", "test/"):
            rows = merged_rows(folder(planned, method, RATES[0], 0))
            assert sorted(rows) == [0, 3, 6, 9, 12]
            for row in rows.values():
                kls = [row[f"{split}retained_kl/{source}"] for source in SOURCES]
                assert row[f"{split}retained_kl"] == pytest.approx(floored_mean(kls), rel=1e-12)


def test_choices_read_validation_and_verdicts_read_test_with_holm_by_hand(planned):
    saved = json.loads((planned / "report" / "report.json").read_text())
    validation = {(m, r, s): logged_curve(folder(planned, m, r, s)) for m in ("lora", "atlas") for r in RATES
                  for s in SEEDS}  # fmt: skip
    start = sum(curve[0][1] for (m, _, _), curve in validation.items() if m == "lora") / (len(RATES) * len(SEEDS))
    reference = max(min(max(t for _, t, _ in validation["lora", r, s]) for s in SEEDS) for r in RATES)
    selection = start + SELECTION_FRACTION * (reference - start)
    assert saved["selection"]["level"] == pytest.approx(selection)
    rates = {}
    for method in ("lora", "atlas"):
        by_rate = {}
        for rate in RATES:
            drifts = [drift_when_reached(validation[method, rate, s], selection) for s in SEEDS]
            by_rate[rate] = None if None in drifts else geometric_mean(drifts)
        eligible = [rate for rate in RATES if by_rate[rate] is not None]
        assert eligible, "the tiny grid should reach the selection level"
        rates[method] = min(eligible, key=lambda rate: by_rate[rate])
    assert {c["method"]: c["rate"] for c in saved["selection"]["choices"]} == rates

    def test_drift(method: str, seed: int, level: float, key: str = "test/retained_kl") -> float | None:
        rows = merged_rows(folder(planned, method, rates[method], seed))
        return drift_when_reached(validation[method, rates[method], seed], level, {s: r[key] for s, r in rows.items()})

    p_values = []
    for fraction, verdict in zip(LEVELS, saved["verdicts"]):
        level = start + fraction * (reference - start)
        assert verdict["level"] == pytest.approx(level) and verdict["split"] == "test"
        ours, theirs = ([test_drift(m, s, level) for s in SEEDS] for m in ("atlas", "lora"))
        assert None not in ours + theirs, "the tiny grid should reach both levels"
        logs = [math.log(a / b) for a, b in zip(ours, theirs)]
        t = (sum(logs) / 2) / (abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2))
        p_values.append(1 - 2 / math.pi * math.atan(abs(t)))  # two-sided, Student's t on 1 df = Cauchy
        assert verdict["ratio"] == pytest.approx(math.exp(sum(logs) / 2))
        assert verdict["drift"] == pytest.approx(geometric_mean(ours))
        assert verdict["p"] == pytest.approx(p_values[-1])
        for source in SOURCES:  # the per-source rows, read at the same points
            row = next(r for r in saved["sources"] if (r["method"], r["source"]) == ("atlas", source))
            by_hand = geometric_mean([test_drift("atlas", s, level, f"test/retained_kl/{source}") for s in SEEDS])
            assert row["drifts"][LEVELS.index(fraction)] == pytest.approx(by_hand)
    low, high = sorted(p_values)
    holm = {low: min(1.0, 2 * low), high: min(1.0, max(2 * low, high))}
    for p, verdict in zip(p_values, saved["verdicts"]):
        assert verdict["p_holm"] == pytest.approx(holm[p])
        side = "less drift" if verdict["ratio"] < 1 else "more drift"
        assert verdict["outcome"] == ("not shown" if holm[p] >= 0.05 else "shown")
        assert verdict["line"].split(": ", 1)[1].startswith("not shown (" if holm[p] >= 0.05 else f"{side} shown (")
        assert f"Holm p {holm[p]:.3g}" in verdict["line"]
    assert "| atlas | code |" in (planned / "report" / "report.md").read_text()
    # the matched-gain sub-report reads the drift the verdicts read: test drifts, at the validation target's levels
    matched = json.loads((planned / "report" / "drift-atlas" / "report.json").read_text())
    atlas = next(summary for summary in matched["methods"] if summary["method"] == "atlas")
    for requirement, drift in zip(matched["requirements"], atlas["drift_by_requirement"]):
        assert drift == pytest.approx(geometric_mean([test_drift("atlas", s, requirement) for s in SEEDS]))


# --- a grid shared by processes ------------------------------------------------------------------------------------


def stand_in(trained: list[RunKey]):
    """A trainer writing a two-checkpoint log by hand, and its loader."""

    def train(key: RunKey, where: Path, step_done) -> ResumePoint:
        trained.append(key)
        rows = [{"step": 0, "target": 0.0, "retained_kl": 0.0}, {"step": 1, "target": 1.0, "retained_kl": 0.1}]
        (where / "drift.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        step_done()
        return ResumePoint(None, 0.0)  # from step 0

    def load(key: RunKey, where: Path) -> Curves:
        run = Run(key.method, str(key.seed), str(where), [(0, 0.0, 0.0), (1, 1.0, 0.1)])
        return Curves(run, None, {"retained": run})

    return train, load


def claim(where: Path, writer: Writer) -> None:
    where.mkdir(parents=True)
    (where / CLAIM_FILE).write_text(json.dumps(dataclasses.asdict(writer)))


def test_a_live_claim_is_passed_over_and_a_dead_ones_taken_over(tmp_path):
    keys = [RunKey("lora", 0.1, seed) for seed in (0, 1, 2)]
    live, dead = current_writer(), dataclasses.replace(current_writer(), pid=2**22 + 1)  # above Linux's pid_max
    claim(keys[0].folder(tmp_path), live)  # as if another process of this host held it
    claim(keys[1].folder(tmp_path), dead)
    (keys[1].folder(tmp_path) / "drift.jsonl").write_text('{"step": 0}\n')  # what the dead process left
    trained: list[RunKey] = []
    train, load = stand_in(trained)
    assert run_grid(keys, tmp_path, {"lora": {"rank": 4}}, 1, train, load) is None  # keys[0] is still the live one's
    assert trained == keys[1:]
    assert read_record(keys[0].folder(tmp_path)) is None
    assert [read_record(key.folder(tmp_path)).final_kl for key in keys[1:]] == [0.1, 0.1]
    assert not (keys[1].folder(tmp_path) / CLAIM_FILE).exists()  # released once trained
    (keys[0].folder(tmp_path) / CLAIM_FILE).unlink()  # the holder went away without finishing
    assert set(run_grid(keys, tmp_path, {"lora": {"rank": 4}}, 1, train, load)) == set(keys)
    assert trained == [*keys[1:], keys[0]]  # each trained once


@pytest.mark.slow  # two interpreters with the whole stack: a minute on two shared cores
@pytest.mark.xdist_group("two-processes")
def test_two_processes_on_one_out_train_each_run_once(inputs, tmp_path):
    out = tmp_path / "out"
    argv = planned_argv(inputs, out, "--threads", "1")
    for option, values in (("--learning_rates", ["0.1"]), ("--max_steps", ["3"]), ("--levels", ["0.1"])):
        start = argv.index(option) + 1
        end = next(i for i in range(start, len(argv)) if argv[i].startswith("--"))
        argv[start:end] = values
    command = [sys.executable, "-m", "kinfolk", *argv]
    processes = [
        subprocess.Popen(command, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=TIMEOUT)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    trained = [re.findall(r"(\w+ lr=0\.1 seed=\d): \d+s,", output) for output in outputs]
    names = {f"{m} lr=0.1 seed={s}" for m in ("lora", "atlas") for s in SEEDS}
    assert sorted(trained[0] + trained[1]) == sorted(names)  # every run once, by one process
    report = json.loads((out / "report" / "report.json").read_text())
    assert {(run["method"], run["seed"]) for run in report["runs"]} == {
        (m, s) for m in ("lora", "atlas") for s in SEEDS
    }
