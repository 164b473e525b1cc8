"""`kinfolk demo --quick` end to end: the report's numbers are the artefacts' numbers."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lab_demo_helpers import demo_results
from peft import AutoPeftModelForCausalLM
from scipy import stats
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.callbacks.schedule import geometric_steps
from kinfolk.commands.demo import main
from kinfolk.lab.demo import evidence
from kinfolk.lab.demo.report import HEADLINE_WIDTH, headline_table
from kinfolk.lab.methods.atlantis import accuracy
from kinfolk.lab.protocol import EXPERIMENTS
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
@pytest.mark.xdist_group("quick-lab-family")  # the worker that builds the quick family once runs its tests
def test_quick_demo_report_matches_its_saved_models(tmp_path, quick_lab_family, lab_cache_dir, capsys):
    out = tmp_path / "demo"
    assert main(["--quick", "--out", str(out), "--cache_dir", str(lab_cache_dir)]) == 0
    results = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    terminal = capsys.readouterr()
    printed = terminal.out
    # a newcomer reads the whole terminal: stage lines, bars and the headline in about 60 lines (a bar redrawn
    # with carriage returns stays one line of the terminal, so lines are counted by their newlines; 62 since the
    # ADAPT headline quotes the real checkpoint's equal-compute result beside the lab's)
    terminal_lines = (terminal.out + terminal.err).count("\n")
    assert terminal_lines <= 65, terminal.err
    assert headline_table(results) in printed
    assert "(pool pr; 1 family)" in printed and "not an effect" in printed  # the headline says what it is
    # fits a 100-column terminal (but for the lines naming where the outputs are: a test's paths are long)
    assert max(len(line) for line in printed.splitlines() if str(out) not in line) <= 100
    for plot in ("atlantis_weights.png", "atlas_retained_kl.png", "adapt_sizes.png"):
        assert (out / plot).stat().st_size > 0 and f"]({plot})" in report
    n, seed = results["config"]["eval_problems"], results["config"]["seed"]
    cell, formula = results["atlantis"]["cell"], results["config"]["atlantis_formula"]
    tokenizer = AutoTokenizer.from_pretrained(out / "models" / f"atlantis-{cell}-{formula}-T1")

    # ATLANTIS: the weighted model's reported accuracy is a recomputation from its saved weights, here under one and
    # two threads and in a fresh process (nothing else that ran in this one can matter)
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
    assert accuracy_in_a_fresh_process(weighted_dir, n, seed, threads=2) == reported["test"]
    assert f"| {formula} (T = 1) | {reported['validation']['mean']:.2f} |" in report
    # ATLAS: the saved adapter reloads (the plugin type is registered) and gives the reported scores
    atlas = AutoPeftModelForCausalLM.from_pretrained(out / "models" / "atlas")
    assert skill_scores(atlas, tokenizer, n=n, seed=seed) == results["atlas"]["scores"]["atlas"]
    step, kl = results["atlas"]["retained_kl"]["atlas"][0]
    assert step == 0 and kl == pytest.approx(0.0, abs=1e-6)  # measured at start: the fresh adapter changes nothing
    # and then at the geometric schedule, on both runs, so the comparison's rise is drawn (or flagged in the report)
    for method in ("atlas", "lora"):
        measured = [step for step, _ in results["atlas"]["target_curve"][method]]
        assert measured == [0, *geometric_steps(results["config"]["adapter_steps"], results["config"]["drift_points"])]

    # lm-eval's exact match on its first `lm_eval_limit` problems (the seed-0 test problems) equals the lab's own
    # greedy accuracy on the same problems
    limit, large_base = results["config"]["lm_eval_limit"], quick_lab_family.load("large_base")
    own = skill_scores(large_base, tokenizer, n=limit, seed=0)
    for skill, value in results["lm_eval"]["large_base"].items():
        assert value == pytest.approx(own[skill]["accuracy"]), skill

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


# ---------------------------------------------------------------------------------------------------- evidence
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def newest_versions() -> dict[str, str]:
    """Each question's newest committed version, read off the results files on their own: per question of the
    registry, the experiment whose `version` has the highest leading number ("2-reanalysis" is 2)."""
    newest: dict[str, tuple[int, str, str]] = {}
    for name, registered in EXPERIMENTS.items():
        if (RESULTS / f"{name}.json").exists():
            version = json.loads((RESULTS / f"{name}.json").read_text())["version"]
            number = int(version.split("-")[0])
            if registered.question not in newest or number > newest[registered.question][0]:
                newest[registered.question] = (number, name, version)
    return {name: version for _, name, version in newest.values()}


NEWEST = newest_versions()
# the earlier versions' primaries the newest ones carry (parts of their question they do not ask again)
CARRIED_NOW = [tuple(entry.split(": ", 1)) for name in NEWEST for entry in EXPERIMENTS[name].carries]
QUOTED = NEWEST | {
    experiment: json.loads((RESULTS / f"{experiment}.json").read_text())["version"] for experiment, _ in CARRIED_NOW
}


def test_the_readme_table_is_the_generated_one_from_the_newest_versions():
    text = (ROOT / "README.md").read_text()
    block = text[text.index(evidence.BEGIN) : text.index(evidence.END) + len(evidence.END)]
    assert block == evidence.readme_block(RESULTS), "README's evidence table is stale: run python " \
        "tools/results_page.py"  # fmt: skip
    assert len(text.splitlines()) <= 200
    assert {row.experiment: row.version for row in evidence.evidence_rows(RESULTS)} == QUOTED
    assert evidence.superseded_quotes(text, RESULTS) == []


def _t_interval(values: list[float]) -> tuple[float, float, float, float]:
    """Mean, 95 % t-interval and the two-sided one-sample p against 0 (t with n - 1 degrees of freedom)."""
    n, mean = len(values), sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half, sd


def test_every_row_recomputes_from_its_results_json():
    rows = evidence.evidence_rows(RESULTS)
    primaries = {
        name: [endpoint for endpoint, entry in json.loads((RESULTS / f"{name}.json").read_text())["endpoints"].items()
               if entry["primary"]]
        for name in QUOTED
    }  # fmt: skip
    expected = [(name, endpoint) for name in NEWEST for endpoint in primaries[name]] + CARRIED_NOW
    assert sorted((row.experiment, row.endpoint) for row in rows) == sorted(expected)
    for experiment in QUOTED:
        endpoints = json.loads((RESULTS / f"{experiment}.json").read_text())["endpoints"]
        mine = [row for row in rows if row.experiment == experiment]
        p_values = {}  # Holm runs over all of the experiment's primaries, quoted or not
        for name in primaries[experiment]:
            entry = endpoints[name]
            values = [v for v in entry["per_unit"] if v is not None]
            mean, low, high, sd = _t_interval(values)
            t = (mean - entry["null"]) / (sd / math.sqrt(len(values)))
            p_values[name] = 2 * stats.t.sf(abs(t), len(values) - 1)
        for row in mine:
            entry = endpoints[row.endpoint]
            mean, low, high, _ = _t_interval([v for v in entry["per_unit"] if v is not None])
            assert (row.estimate, *row.ci95) == pytest.approx((mean, low, high), abs=1e-6), row.endpoint
            assert row.interval == f"{row.estimate:+.3f} [{row.ci95[0]:+.3f}, {row.ci95[1]:+.3f}]"
            method, baseline = entry["absolute"]["method"], entry["absolute"]["baseline"]
            if None in method:  # a concordance: no arms to show
                assert row.absolute == ""
            else:
                means = (sum(method) / len(method), sum(baseline) / len(baseline))
                assert (row.method_mean, row.baseline_mean) == pytest.approx(means)
                assert row.absolute == f"{means[0]:.3g} vs {means[1]:.3g}"
        # Holm by hand: the k-th smallest p times (m - k + 1), running maximum; shown where below 0.05
        ordered, running, shown = sorted(p_values.items(), key=lambda item: item[1]), 0.0, {}
        for k, (name, p) in enumerate(ordered):
            running = max(running, min(1.0, (len(ordered) - k) * p))
            shown[name] = running < 0.05
        assert {row.endpoint: row.shown for row in mine} == {row.endpoint: shown[row.endpoint] for row in mine}
        # the words: the sentence for the outcome from the plan's claims, else from the addendum written after the
        # results (plans that predate claims), marked so
        addendum = RESULTS / f"{experiment}.claims-addendum.json"
        before = not addendum.exists()
        if before:
            plan = json.loads((RESULTS / f"{experiment}.plan.json").read_text())
            claims = {primary["name"]: primary["claim"] for primary in plan["primaries"]}
        else:
            claims = json.loads(addendum.read_text())["claims"]
        for row in mine:
            entry, claim = endpoints[row.endpoint], claims[row.endpoint]
            on_methods_side = (entry["mean"] > entry["null"]) == (entry["direction"] == "higher")
            key = ("if_shown" if on_methods_side else "if_reversed") if shown[row.endpoint] else "if_not_shown"
            assert (row.claim, row.claim_before_results) == (claim[key], before)
            assert row.sentence == (claim[key] if before else f"{claim[key]} {evidence.AFTER_MARK}")
            assert claim["scope"] in row.claim


def test_the_headline_quotes_only_the_newest_versions(tmp_path, monkeypatch):
    text = headline_table(demo_results(), RESULTS)
    assert max(len(line) for line in text.splitlines()) <= HEADLINE_WIDTH
    assert "(pool pr; 1 family)" in text
    blocks = [line for line in text.splitlines() if not line.startswith(" ")]
    assert [b.split()[0] for b in blocks] == ["ATLANTIS", "ATLAS", "ADAPT", "ADAPT"]  # one block per comparison
    quoted = set(re.findall(r"\b([a-z][\w-]*) v(\d+)\b", text))
    assert quoted == {
        ("atlantis-controls", "3"),
        ("atlas-controls", "3"),
        ("adapt-frontier", "4"),
        ("adapt-compute", "5"),
        ("real-boomerang-compute", "3"),  # distillation at equal compute on a real checkpoint too
    }
    assert evidence.superseded_quotes(text, RESULTS) == []
    words = " ".join(text.split())  # as read, across the wrapped lines
    ratio = json.loads((RESULTS / "atlantis-controls.json").read_text())["endpoints"]["strong/pr: ratio - uniform"]
    assert not ratio["survives_holm"] and f"strong/pr: ratio - uniform {ratio['mean']:+.3f}" in words
    not_shown = json.loads((RESULTS / "atlantis-controls.claims-addendum.json").read_text())["claims"]
    said = " ".join(not_shown["strong/pr: ratio - uniform"]["if_not_shown"].split())
    assert f"{said} {evidence.AFTER_MARK}" in words  # the sentence for its outcome says the verdict, marked as late

    # a newer version of the ATLAS question appears: the old headline is superseded, the new one quotes it
    monkeypatch.setitem(evidence.QUESTIONS, "atlas-next", "ATLAS")
    for path in RESULTS.glob("*.json"):
        if not path.name.endswith(".plan.json"):
            (tmp_path / path.name).write_text(path.read_text())
    newer = json.loads((RESULTS / "atlas-controls.json").read_text()) | {"experiment": "atlas-next", "version": "4"}
    (tmp_path / "atlas-next.json").write_text(json.dumps(newer))
    assert evidence.superseded_quotes(text, tmp_path) == ["atlas-controls v3"]
    revised = headline_table(demo_results(), tmp_path)
    assert "atlas-next v4" in revised and evidence.superseded_quotes(revised, tmp_path) == []
    assert "docs/results.md" in headline_table(demo_results(), ROOT / "nowhere")  # no committed results at hand


def test_a_newer_version_carries_the_parts_of_its_question_it_does_not_ask_again(tmp_path, monkeypatch):
    for path in RESULTS.glob("*.json"):
        if not path.name.endswith(".plan.json"):
            (tmp_path / path.name).write_text(path.read_text())
    older = json.loads((RESULTS / "atlas-controls.json").read_text())
    asked, kept, *dropped = [name for name, entry in older["endpoints"].items() if entry["primary"]]
    newer = older | {"experiment": "atlas-next", "version": "4", "endpoints": {asked: older["endpoints"][asked]}}
    (tmp_path / "atlas-next.json").write_text(json.dumps(newer))
    monkeypatch.setitem(evidence.QUESTIONS, "atlas-next", "ATLAS")
    carried = {"atlas-next": (f"atlas-controls: {kept}",)}
    rows = [row for row in evidence.evidence_rows(tmp_path, carried=carried) if row.question == "ATLAS"]
    assert [(row.label, row.endpoint) for row in rows] == [("atlas-next v4", asked), ("atlas-controls v3", kept)]
    assert dropped and not any(row.endpoint in dropped for row in rows)  # asked again or dropped: not quoted
    assert evidence.superseded_quotes("atlas-controls v3", tmp_path, carried=carried) == []
    assert evidence.superseded_quotes("atlas-controls v3", tmp_path, carried={}) == ["atlas-controls v3"]
    with pytest.raises(KeyError, match=r"atlas-controls.json: atlas-next carries 'no such', which is not one of"):
        evidence.evidence_rows(tmp_path, carried={"atlas-next": ("atlas-controls: no such",)})


def test_the_results_pages_known_blocks_quote_each_questions_newest_version():
    text = (ROOT / "docs" / "results.md").read_text()
    blocks = dict(re.findall(r"<!-- known:([\w-]+) -->\n(.*?)\n<!-- /known:\1 -->", text, flags=re.DOTALL))
    assert set(blocks) == {"atlantis", "atlas", "adapt", "atlas-real-checkpoint", "adapt-real-checkpoint"}
    quoted = {re.match(r"From `([\w-]+)` version (\S+) \(", block).groups() for block in blocks.values()}
    assert quoted == set(NEWEST.items())
    assert evidence.superseded_quotes(text[: text.index("## Experiments, version by version")], RESULTS) == []
