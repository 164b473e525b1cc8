"""`kinfolk demo --quick` end to end: the report's numbers are the artefacts' numbers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.commands.demo import main
from kinfolk.lab.demo.report import headline_table
from kinfolk.lab.methods.atlantis import accuracy
from kinfolk.lab.world.evaluate import skill_scores

FRESH_ACCURACY = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from kinfolk.lab.methods.atlantis import accuracy
path, n, seed, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
print(json.dumps(accuracy(model, tokenizer, n, seed, "test")))
"""


def accuracy_in_a_fresh_process(model_dir: Path, n: int, seed: int, threads: int) -> dict[str, float]:
    environment = os.environ | {"OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-c", FRESH_ACCURACY, str(model_dir), str(n), str(seed), str(threads)],
        capture_output=True, text=True, env=environment, timeout=600, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.xdist_group("quick-lab-family")  # one worker builds the family, the other test reuses it
def test_quick_demo_report_matches_its_saved_models(tmp_path, lab_cache_dir, capsys):
    out = tmp_path / "demo"
    assert main(["--quick", "--out", str(out), "--cache_dir", str(lab_cache_dir)]) == 0
    results = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    terminal = capsys.readouterr()
    printed = terminal.out
    # a newcomer reads the whole terminal: stage lines, bars and the headline in about 60 lines (a bar redrawn
    # with carriage returns stays one line of the terminal, so lines are counted by their newlines)
    terminal_lines = (terminal.out + terminal.err).count("\n")
    assert terminal_lines <= 60, terminal.err
    assert headline_table(results) in printed
    assert "(pool pr; 1 family)" in printed and "not an effect" in printed  # the headline says what it is
    # fits a 100-column terminal (but for the lines naming where the outputs are: a test's paths are long)
    assert max(len(line) for line in printed.splitlines() if str(out) not in line) <= 100
    for plot in ("atlantis_weights.png", "atlas_retained_kl.png", "adapt_sizes.png"):
        assert (out / plot).stat().st_size > 0 and f"]({plot})" in report
    n, seed = results["config"]["eval_problems"], results["config"]["seed"]
    cell, formula = results["atlantis"]["cell"], results["config"]["atlantis_formula"]
    tokenizer = AutoTokenizer.from_pretrained(out / "models" / f"atlantis-{cell}-{formula}-T1")

    # ATLANTIS: the weighted model's reported accuracy is a recomputation from its saved weights, under one and two
    # threads here and in a fresh process (nothing else that ran in this one can matter)
    weighted_dir = out / "models" / f"atlantis-{cell}-{formula}-T1"
    weighted = AutoModelForCausalLM.from_pretrained(weighted_dir)
    reported = results["atlantis"]["run"]["cells"][cell]["training"][formula]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert accuracy(weighted, tokenizer, n, seed, "test") == reported["test"], f"{threads} threads"
    finally:
        torch.set_num_threads(before)
    for threads in (1, 2):
        assert accuracy_in_a_fresh_process(weighted_dir, n, seed, threads=threads) == reported["test"], threads
    assert f"| {formula} (T = 1) | {reported['validation']['mean']:.2f} |" in report
    # ATLAS: the saved adapter reloads (the plugin type is registered) and gives the reported scores
    atlas = AutoPeftModelForCausalLM.from_pretrained(out / "models" / "atlas")
    assert skill_scores(atlas, tokenizer, n=n, seed=seed) == results["atlas"]["scores"]["atlas"]
    step, kl = results["atlas"]["retained_kl"]["atlas"][0]
    assert step == 0 and kl == pytest.approx(0.0, abs=1e-6)  # measured at start: the fresh adapter changes nothing

    # lm-eval's exact match on the same first problems equals the lab's own greedy accuracy
    for skill, value in results["lm_eval"]["large_base"].items():
        assert value == pytest.approx(results["family"]["scores"]["large_base"][skill]["accuracy"]), skill

    # ADAPT: every size of each variant's families is a saved model of the reported depth, and its reported
    # accuracy is the evaluator's on the saved weights (the variant's format)
    for variant, entry in results["adapt"]["transfer"].items():
        for curve in entry["curves"].values():
            for size in curve["chosen"]:
                config = json.loads((Path(size["dir"]) / "config.json").read_text())
                assert config["num_hidden_layers"] == size["layers"]
        smallest = entry["curves"]["weight-delta"]["chosen"][0]
        fmt = 2 if variant == "large_bracket" else 0
        scores = skill_scores(AutoModelForCausalLM.from_pretrained(smallest["dir"]), tokenizer,
                              ["copy", "reverse"], n, seed, fmt)  # fmt: skip
        assert smallest["test"]["copy"] == scores["copy"]["accuracy"]
    for method in ("distilled", "weight-delta"):
        assert (out / f"adapt_routing_{method}.png").stat().st_size > 0
        assert results["adapt"]["routing"][method]["fixed"]  # every fixed size measured beside the routings
