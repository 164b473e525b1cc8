"""`kinfolk compare` on a micro grid (tiny Llama, LoRA and ATLAS x 2 rates x 2 seeds, 12 steps measured every 3),
checked against what its own logs say, recomputed here by hand:

- resume per run: a second call trains nothing (no `train` call, every run.json untouched), and a run left without
  its run.json (interrupted) is the only one trained again;
- the rate choice equals the rule applied by hand to the runs' drift.jsonl curves;
- the verdicts' ratios and drifts recompute from the drift.jsonl files of the chosen runs;
- bad input is refused in one line with exit 2 before any model loads.

The rule's pieces on curves made up by hand (five seeds, the t-interval) and the target metric callback (the
validation NLL against a plain forward pass; measuring leaves training unchanged) are checked without the grid.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from compare_helpers import compare_inputs, drift_when_reached, geometric_mean, logged_curve
from refusal_helpers import assert_command_refused
from sft_helpers import CPU_FP32

from kinfolk.callbacks.target_metric import TargetMetricCallback, validation_nll
from kinfolk.commands import main
from kinfolk.compare.runs import CompareRuns
from kinfolk.compare.verdicts import verdicts
from kinfolk.drift import Run
from kinfolk.drift.levels import gain_level
from kinfolk.testing import build_model, prompt_completion_dataset
from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

SELECTION_FRACTION = 0.25
LEVELS = [0.25, 0.5, 0.75]


@pytest.fixture(scope="module")
def inputs(tiny_kit, tmp_path_factory) -> dict[str, Path]:
    return compare_inputs(tiny_kit, tmp_path_factory.mktemp("compare-inputs"))


def compare_argv(inputs, out, *options) -> list[str]:
    return [
        "compare", "--model_name_or_path", inputs["model"], "--dataset_name", inputs["target"],
        "--retained_dataset_name", inputs["retained"], "--out", out, "--use_cpu",
        "--methods", "lora", "atlas", "--learning_rates", "3e-2", "1e-1", "--seeds", "0", "1",
        "--max_steps", "12", "--eval_steps", "3", "--per_device_train_batch_size", "4", "--rank", "4",
        "--atlas_regions", "2", "--atlas_directions", "2", "--selection_fraction", str(SELECTION_FRACTION),
        "--levels", *map(str, LEVELS), "--churn_tokens", "4", *options,
    ]  # fmt: skip


def run_compare(argv) -> int:
    return main([str(argument) for argument in argv])


@pytest.fixture(scope="module")
def micro(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("compare") / "out"
    assert run_compare(compare_argv(inputs, out)) == 0
    return out


def run_folders(out: Path) -> list[Path]:
    return sorted(path.parent for path in (out / "runs").rglob("drift.jsonl"))


def report(out: Path) -> dict:
    return json.loads((out / "report" / "report.json").read_text())


# --- curves read by hand from the logs -----------------------------------------------------------------------------


def curves(out: Path) -> dict[tuple[str, float, int], list]:
    found = {}
    for folder in run_folders(out):
        method, rate, seed = folder.parts[-3], float(folder.parts[-2].removeprefix("lr-")), int(folder.parts[-1][5:])
        found[method, rate, seed] = logged_curve(folder)
    return found


# --- the micro grid ------------------------------------------------------------------------------------------------


def test_the_grid_trains_every_run_once_and_a_rerun_trains_nothing(inputs, micro, monkeypatch, capsys):
    folders = run_folders(micro)
    assert len(folders) == 8 and all((folder / "run.json").is_file() for folder in folders)
    steps = {json.loads((folder / "run.json").read_text())["steps"] for folder in folders}
    assert steps == {12}
    assert all([point[0] for point in logged_curve(folder)] == [0, 3, 6, 9, 12] for folder in folders)
    mtimes = {folder: (folder / "run.json").stat().st_mtime_ns for folder in folders}
    trained, original = [], CompareRuns.train

    def counted(self, key, *rest):
        trained.append(key.name)
        return original(self, key, *rest)

    monkeypatch.setattr(CompareRuns, "train", counted)
    capsys.readouterr()
    assert run_compare(compare_argv(inputs, micro)) == 0
    assert trained == []
    assert {folder: (folder / "run.json").stat().st_mtime_ns for folder in folders} == mtimes
    lines = [line for line in capsys.readouterr().err.splitlines() if "done earlier" in line]
    assert len(lines) == 8  # one line per run

    interrupted = micro / "runs" / "atlas" / "lr-0.03" / "seed-1"
    (interrupted / "run.json").unlink()
    assert run_compare(compare_argv(inputs, micro)) == 0
    assert trained == ["atlas lr=0.03 seed=1"]
    assert [point[0] for point in logged_curve(interrupted)] == [0, 3, 6, 9, 12]  # its old log was cleared first
    assert {f: (f / "run.json").stat().st_mtime_ns for f in folders if f != interrupted} == {
        f: t for f, t in mtimes.items() if f != interrupted
    }


def baseline_scale(found) -> tuple[float, float]:
    """(start, reference) of the levels: lora's mean step-0 score, and the best over its rates of the lowest best
    score among the rate's seeds."""
    lora = [curve for (method, _, _), curve in found.items() if method == "lora"]
    start = np.mean([curve[0][1] for curve in lora])
    rates = {rate for method, rate, _ in found if method == "lora"}
    best = {rate: min(max(t for _, t, _ in found["lora", rate, seed]) for seed in (0, 1)) for rate in rates}
    return start, max(best.values())


def test_each_methods_rate_is_the_hand_computed_choice(micro):
    found = curves(micro)
    start, reference = baseline_scale(found)
    level = start + SELECTION_FRACTION * (reference - start)
    selection = report(micro)["selection"]
    assert selection["level"] == pytest.approx(level)
    for choice in selection["choices"]:
        by_rate = {}
        for rate in (0.03, 0.1):
            drifts = [drift_when_reached(found[choice["method"], rate, seed], level) for seed in (0, 1)]
            by_rate[rate] = None if None in drifts else geometric_mean(drifts)
            assert choice["drift_by_rate"][f"{rate:g}"] == pytest.approx(by_rate[rate])
        eligible = [rate for rate, drift in by_rate.items() if drift is not None]
        assert eligible, "the micro grid should reach the selection level"
        assert choice["rate"] == min(eligible, key=lambda rate: by_rate[rate])


def test_the_verdicts_recompute_from_the_chosen_runs_logs(micro):
    found, saved = curves(micro), report(micro)
    rates = {choice["method"]: choice["rate"] for choice in saved["selection"]["choices"]}
    chosen = {m: [found[m, rates[m], seed] for seed in (0, 1)] for m in ("lora", "atlas")}
    start, reference = baseline_scale(found)  # the selection level's scale
    assert len(saved["verdicts"]) == len(LEVELS)
    reached = 0
    for fraction, verdict in zip(LEVELS, saved["verdicts"]):
        level = start + fraction * (reference - start)
        assert verdict["level"] == pytest.approx(level)
        atlas = [drift_when_reached(curve, level) for curve in chosen["atlas"]]
        lora = [drift_when_reached(curve, level) for curve in chosen["lora"]]
        if None in atlas + lora:
            assert verdict["outcome"] == "not reached" and verdict["ratio"] is None
            continue
        reached += 1
        assert verdict["ratio"] == pytest.approx(geometric_mean([a / b for a, b in zip(atlas, lora)]))
        assert verdict["drift"] == pytest.approx(geometric_mean(atlas))
        assert verdict["baseline_drift"] == pytest.approx(geometric_mean(lora))
        assert verdict["outcome"] == "not tested"  # two seeds: no interval, so nothing was tested
        assert "not tested (2 seeds; an interval needs 5): ratio " in verdict["line"]
        assert verdict["line"].startswith(f"atlas vs lora at target {level:.4g} ({fraction:.0%} of lora's gain): ")
    assert reached, "the micro grid should reach a verdict level"
    text = (micro / "report" / "report.md").read_text()
    assert text.splitlines()[2].startswith("Exploratory comparison (no --plan)")
    assert all(f"- {verdict['line']}" in text for verdict in saved["verdicts"])
    assert (micro / "report" / "curves.png").stat().st_size > 0
    assert (micro / "report" / "drift-atlas" / "report.md").is_file()


def test_the_report_opens_with_the_answer_on_shared_axes(micro):
    """report.md opens with compare.png and the verdicts, in the four words; curves.png's panels share their axes
    row by row and compare.png's axes hold every chosen run's drift (the limits the figures were drawn with)."""
    saved, text = report(micro), (micro / "report" / "report.md").read_text()
    answer = text[text.index("## The answer") : text.index("## Set-up")]
    assert answer.index("![") < answer.index("- atlas vs lora at target")  # the figure first, then the verdicts
    assert "(compare.png)" in answer
    assert {verdict["outcome"] for verdict in saved["verdicts"]} <= {"shown", "not shown", "not tested", "not reached"}
    limits = json.loads((micro / "report" / "figures.json").read_text())
    curves_panels = limits["curves.png"]
    assert len(curves_panels) == 4  # two methods x (target by step, KL by target)
    top, bottom = curves_panels[:2], curves_panels[2:]
    for row in (top, bottom):
        assert row[0]["xlim"] == row[1]["xlim"] and row[0]["ylim"] == row[1]["ylim"]
    (compare_axes,) = limits["compare.png"]
    assert (
        compare_axes["yscale"] == "log"
        and "retained KL" in compare_axes["ylabel"]
        and "target" in (compare_axes["xlabel"])
    )
    rates = {choice["method"]: choice["rate"] for choice in saved["selection"]["choices"]}
    found = curves(micro)
    drifts = [kl for (method, rate, _), curve in found.items() if rate == rates[method] for step, _, kl in curve
              if step and kl > 0]  # fmt: skip
    low, high = compare_axes["ylim"]
    assert low <= min(drifts) and max(drifts) <= high
    start, reference = baseline_scale(found)
    for method in ("lora", "atlas"):  # the share of lora's gain each method reaches, every seed at its chosen rate
        lowest_best = min(max(t for _, t, _ in found[method, rates[method], seed]) for seed in (0, 1))
        assert saved["reached"][method] == pytest.approx((lowest_best - start) / (reference - start))
        assert f"- {method}: {saved['reached'][method]:.0%}" in answer


def test_churn_at_each_level_is_read_at_the_checkpoint_nearest_it(micro):
    """Per chosen run and level: the measurement nearest where the run first reaches the level (by target), and the
    count of the retained prompts' greedy answers there that differ from step 0's, averaged over seeds."""
    saved = report(micro)
    rates = {choice["method"]: choice["rate"] for choice in saved["selection"]["choices"]}
    measured = 0
    for churn in saved["churn"]:
        counts, steps = [], []
        for seed in (0, 1):
            folder = micro / "runs" / churn["method"] / f"lr-{rates[churn['method']]:g}" / f"seed-{seed}"
            answers = {row["step"]: row["answers"] for row in map(json.loads, (folder / "answers.jsonl").open())}
            assert len(answers[0]) == 8  # every retained validation row (fewer than --churn_prompts)
            records = []
            for point in logged_curve(folder):
                if not records or point[1] > records[-1][1]:
                    records.append(point)
            around = [(a, b) for a, b in itertools.pairwise(records) if a[1] <= churn["level"] <= b[1]]
            if not around:
                steps.append(None)
                continue
            (a, b), level = around[0], churn["level"]
            step = a[0] if level - a[1] < b[1] - level else b[0]
            steps.append(step)
            counts.append(sum(x != y for x, y in zip(answers[0], answers[step])))
        assert churn["steps"] == steps
        if None in steps:
            assert churn["changed"] is None
            continue
        measured += 1
        assert churn["changed"] == pytest.approx(sum(counts) / len(counts)) and churn["prompts"] == 8
    assert measured, "the micro grid should reach a verdict level"
    text = (micro / "report" / "report.md").read_text()
    assert "retained answers changed with" in text and "checkpoint nearest the level" in text


def test_a_chosen_rate_at_its_grids_end_is_flagged_with_a_grid_the_command_accepts(micro, inputs):
    from kinfolk.commands.parsing import VerbParser
    from kinfolk.compare.options import CompareArguments

    saved = report(micro)
    warnings = saved["edge_warnings"]
    assert len(warnings) == 2  # two rates per method: every choice is at an end
    for warning, choice in zip(warnings, saved["selection"]["choices"]):
        end = "largest" if choice["rate"] == 0.1 else "smallest"
        assert warning.startswith(f"{choice['method']}: the chosen --learning_rates {choice['rate']:.3g} is the {end}")
        suggested = warning.split("e.g. ")[1].split()
        argv = [str(a) for a in compare_argv(inputs, micro)[1:]]
        at = argv.index("--learning_rates")
        argv[at : at + 3] = suggested
        (args,) = VerbParser(CompareArguments, prog="kinfolk compare").parse(argv)
        assert len(args.learning_rates) == 3 and choice["rate"] in args.learning_rates
    assert all(f"- {warning}" in (micro / "report" / "report.md").read_text() for warning in warnings)


def test_help_lists_every_option_with_its_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    for option in ("--methods", "--learning_rates", "--seeds", "--eval_steps", "--metric", "--lm_eval_task"):
        assert option in shown
    assert "lora_output_kl: LoRA plus Output-KL" in shown and "osf: OSF" in shown


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr("kinfolk.compare.runs.AutoModelForCausalLM.from_pretrained", refuse)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (["--methods", "lora", "dora"], "--methods: unknown method 'dora'"),
        (["--baseline", "full"], "--baseline full is not among --methods lora atlas"),
        (["--metric", "no_such_module_here:score"], "--metric no_such_module_here:score: cannot import"),
        (["--metric", "json:no_such_function"], "json has no function 'no_such_function'"),
        (["--metric", "json:loads", "--lm_eval_task", "x"], "--metric and --lm_eval_task each set the target"),
        (["--eval_steps", "20"], "need 1 <= --eval_steps <= --max_steps"),
        (["--dataset_validation_split", "dev"], "not 'dev'"),
        (["--retained_kl_split", "test"], "not 'test'"),
        (["--plan"], "--plan needs --test_split"),
        (["--retained_dataset_name", "r=a/", "r=b/"], "distinct names, got ['r', 'r']"),
        (["--test_split", "validation"], "--test_split validation is also a training or validation split"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_model_loads(inputs, tmp_path, no_model_loads, change, named):
    out = tmp_path / "out"
    assert_command_refused([*compare_argv(inputs, out), *change], named, destination=out)  # the last value wins


def test_a_run_trained_under_other_settings_is_refused_naming_it(inputs, micro, no_model_loads):
    argv = compare_argv(inputs, micro)
    argv[argv.index("--max_steps") + 1] = "6"
    before = {folder: (folder / "drift.jsonl").read_bytes() for folder in run_folders(micro)}
    assert_command_refused(
        argv, micro / "runs" / "lora" / "lr-0.03" / "seed-0", "trained with other settings (max_steps 12 (now 6))"
    )
    assert {folder: (folder / "drift.jsonl").read_bytes() for folder in run_folders(micro)} == before


# --- the rule's pieces on curves made up by hand -------------------------------------------------------------------


def test_five_seeds_give_a_t_interval_and_a_verdict_either_way():
    stats = pytest.importorskip("scipy.stats")
    spread = [0.9, 1.0, 1.1, 1.05, 0.95]

    def runs(ratio_by_seed):
        made = []
        for seed, (ratio, noise) in enumerate(zip(ratio_by_seed, spread)):
            made.append(Run("lora", str(seed), "l", [(0, 0.0, 0.0), (4, 2.0, 0.04 * noise)]))
            made.append(Run("atlas", str(seed), "a", [(0, 0.0, 0.0), (4, 2.0, 0.04 * noise * ratio)]))
        return made

    for ratios, outcome in (
        ([0.5, 0.55, 0.45, 0.6, 0.5], "shown"),
        ([0.5, 2.0, 0.8, 1.5, 1.1], "not shown"),
    ):
        made = runs(ratios)
        (verdict,) = verdicts(made, "lora", [gain_level(0.5, [[run for run in made if run.method == "lora"]])])
        logs = np.log(ratios)
        half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
        assert verdict.ratio == pytest.approx(math.exp(logs.mean()))
        assert (verdict.low, verdict.high) == pytest.approx(
            (math.exp(logs.mean() - half), math.exp(logs.mean() + half))
        )
        assert verdict.outcome == outcome
        said = {"shown": "less drift shown (ratio", "not shown": "not shown (ratio"}[outcome]
        assert said in verdict.line and "significant" not in verdict.line


# --- the target metric callback ------------------------------------------------------------------------------------


def test_validation_nll_is_minus_the_mean_completion_token_nll(tiny_tokenizer):
    rows = prompt_completion_dataset(5, seed=7)
    model = build_model("llama", tokenizer=tiny_tokenizer).eval()
    measured = validation_nll(rows, tiny_tokenizer, batch_size=2)(model, tiny_tokenizer)
    total = count = 0.0
    for row in rows:
        prompt = tiny_tokenizer(row["prompt"])["input_ids"]
        full = tiny_tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tiny_tokenizer.eos_token_id]
        with torch.no_grad():
            log_probs = torch.log_softmax(model(torch.tensor([full])).logits[0, :-1].double(), -1)
        targets = torch.tensor(full[1:])
        picked = log_probs[torch.arange(len(targets)), targets][len(prompt) - 1 :]
        total, count = total + float(picked.sum()), count + len(picked)
    assert measured == pytest.approx(total / count, rel=1e-5)


def test_measuring_the_target_leaves_training_unchanged(tiny_tokenizer, tmp_path):
    """A measure that draws random numbers and switches modes: the trained weights are those of a run without it,
    and its values are logged at steps 0, 2, 4 (the end)."""
    seen = []

    def noisy(model, tokenizer):
        seen.append(model.training)
        model.train()
        return float(torch.rand(()).item()) + len(seen)

    def trained(folder, measure):
        torch.manual_seed(0)
        trainer = WeightedSFTTrainer(
            model=build_model("llama", tokenizer=tiny_tokenizer),
            args=WeightedSFTConfig(str(folder), **{**CPU_FP32, "max_steps": 4, "weight_column": None}),
            train_dataset=prompt_completion_dataset(8),
            processing_class=tiny_tokenizer,
        )
        if measure is not None:
            trainer.add_callback(TargetMetricCallback(trainer, measure, every_n_steps=2))
        trainer.train()
        return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}

    plain, measured = trained(tmp_path / "plain", None), trained(tmp_path / "measured", noisy)
    assert all(torch.equal(plain[name], measured[name]) for name in plain)
    rows = [json.loads(line) for line in (tmp_path / "measured" / "drift.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 2, 4] and seen == [False] * 3
    assert [math.floor(row["target"]) for row in rows] == [1, 2, 3]


def test_an_lm_eval_target_is_the_tasks_metric_and_a_missing_metric_is_named(tiny_kit):
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM

    from kinfolk.callbacks.evaluation import run_lm_eval
    from kinfolk.callbacks.target_metric import lm_eval_metric
    from kinfolk.errors import InputError
    from kinfolk.eval_tasks import task_dir

    task, tasks = "kinfolk_csqa_sample", TaskManager(include_path=str(task_dir()), include_defaults=False)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama")), tiny_kit.tokenizer()
    score = lm_eval_metric(task, "acc", limit=4, batch_size=2, task_manager=tasks)(model, tokenizer)
    _, samples = run_lm_eval(model, tokenizer, [task], tasks, limit=4, batch_size=2)
    assert score == pytest.approx(np.mean([record["acc"] for record in samples[task]]))
    with pytest.raises(InputError, match=f"{task} has no metric 'f1'; it reports .*lm_eval/{task}/acc"):
        lm_eval_metric(task, "f1", limit=4, batch_size=2, task_manager=tasks)(model, tokenizer)
