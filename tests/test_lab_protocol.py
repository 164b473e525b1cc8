"""The lab's experiment framework: selection that cannot see test, plans before runs, resumable runs, statistics
against hand computations, and the committed results checked by `kinfolk lab check` in test_lab_check.py (each
experiment's own recompute is in test_lab_contract.py)."""

import dataclasses
import json
from pathlib import Path

import pytest

from kinfolk.lab.protocol import (
    EndpointValue,
    Experiment,
    Plan,
    PlanError,
    PlanMismatch,
    PrimaryEndpoint,
    SelectionView,
    TestFieldAccess,
    get_experiment,
)
from kinfolk.lab.protocol.analysis import correct, summarise
from kinfolk.lab.protocol.plan import CLAIMS_SCHEMA, Claim, load_plan, sha256_of, write_plan
from kinfolk.lab.protocol.runner import run_experiment
from kinfolk.lab.protocol.sentences import FixedClaim

ROOT = Path(__file__).resolve().parents[1]

RECORD = {"runs": [{"lr": 0.1, "validation": 0.5, "test": 0.9}, {"lr": 0.3, "validation": 0.7, "test": 0.2}]}


@pytest.mark.parametrize(
    "read",
    [
        lambda v: v["runs"][0]["test"],
        lambda v: v["runs"][0].get("test"),
        lambda v: "test" in v["runs"][1],
        lambda v: v["runs"][0].test,
        lambda v: getattr(v["runs"][0], "test", None),
        lambda v: [r["test"] for r in v["runs"][:1]],
    ],
)
def test_a_selection_that_reads_a_test_field_fails(read):
    with pytest.raises(TestFieldAccess, match="test field 'test'"):
        read(SelectionView(RECORD))


def test_the_view_shows_everything_else_and_cannot_be_changed():
    view = SelectionView(RECORD)
    assert max(view["runs"], key=lambda r: r["validation"])["lr"] == 0.3
    assert sorted(view["runs"][0]) == ["lr", "validation"] and len(view["runs"][0]) == 2
    assert "test" not in dict(view["runs"][0].items())  # iterating lists no hidden field
    with pytest.raises(TypeError):
        view.runs = []  # type: ignore[misc]

    @dataclasses.dataclass
    class Split:
        validation: float
        test: float

    typed = SelectionView({"split": Split(0.4, 0.8)})
    assert typed["split"].validation == 0.4
    with pytest.raises(TestFieldAccess):
        typed["split"].test  # noqa: B018


@dataclasses.dataclass(frozen=True)
class ToySettings:
    grid: list[float] = dataclasses.field(default_factory=lambda: [0.1, 0.3])


class Toy(Experiment):
    """Five units, two runs each: pick the run's lr on validation, report test minus a baseline of 0.5."""

    name, version, settings_class = "toy", "1", ToySettings

    def __init__(self, peek: bool = False):
        super().__init__()
        self.peek, self.loaded = peek, []

    def primaries(self):
        return [PrimaryEndpoint("gain", "test score minus 0.5", "half", "higher")]

    def units(self):
        return [0, 1, 2, 3, 4]

    def runs_per_unit(self):
        return 2

    def selection_rules(self):
        return {"lr": "highest validation score"}

    def load_run(self, unit, run):
        self.loaded.append((unit, run))
        shift = 0.01 * unit + 0.001 * run
        return {"runs": [{"lr": 0.1, "validation": 0.5, "test": 0.6 + shift}, {"lr": 0.3, "validation": 0.7,
                                                                                  "test": 0.7 + shift}]}  # fmt: skip

    def select(self, view):
        runs = view["runs"]
        if self.peek:
            return {"index": max(range(len(runs)), key=lambda i: runs[i]["test"])}
        return {"index": max(range(len(runs)), key=lambda i: runs[i]["validation"])}

    def analyse(self, record, selection):
        test = record["runs"][selection["index"]]["test"]
        return {"gain": EndpointValue(test - 0.5, test, 0.5, grid_edge=selection["index"] in (0, 1))}


def _plan(tmp_path, experiment) -> Path:
    path = tmp_path / "toy.plan.json"
    write_plan(experiment.plan(), path)
    return path


def test_runner_resumes_per_run_and_reports_the_selected_test_numbers(tmp_path):
    toy = Toy()
    plan = _plan(tmp_path, toy)
    results = run_experiment(toy, plan, tmp_path / "work")
    assert len(toy.loaded) == 10
    entry = results["endpoints"]["gain"]
    assert entry["per_unit"] == pytest.approx([0.2005, 0.2105, 0.2205, 0.2305, 0.2405])  # mean of the two runs
    assert results["plan_sha256"] == sha256_of(plan) and results["runs_per_unit"] == 2
    assert entry["favours_method"] == 5 and entry["survives_holm"] and entry["grid_edge"]
    again = Toy()
    assert run_experiment(again, plan, tmp_path / "work") == results and again.loaded == []  # read back


def test_a_selection_peeking_at_test_stops_the_runner(tmp_path):
    toy = Toy(peek=True)
    with pytest.raises(TestFieldAccess):
        run_experiment(toy, _plan(tmp_path, toy), tmp_path / "work")


def test_runs_of_another_plan_are_refused(tmp_path):
    toy = Toy()
    plan = _plan(tmp_path, toy)
    run_experiment(toy, plan, tmp_path / "work")
    digest = sha256_of(plan)
    record = tmp_path / "work" / "toy" / digest[:16] / "3" / "1.json"
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "plan_sha256": "0" * 64}))  # a run started under another plan
    with pytest.raises(PlanMismatch, match="another plan"):
        run_experiment(Toy(), plan, tmp_path / "work")


def test_a_plan_that_is_not_the_experiment_is_refused(tmp_path):
    toy = Toy()
    path = tmp_path / "toy.plan.json"
    changed = dataclasses.replace(toy.plan(), selection={"lr": "highest test score"})
    path.write_text(changed.to_json())
    with pytest.raises(PlanMismatch, match="selection"):
        run_experiment(toy, path, tmp_path / "work")
    with pytest.raises(PlanMismatch, match="new version"):
        write_plan(toy.plan(), path)  # a committed plan is never rewritten


def test_a_plan_holds_at_most_six_primaries_and_hashes_its_bytes(tmp_path):
    endpoints = [PrimaryEndpoint(f"e{i}", "d", "b", "higher") for i in range(7)]
    with pytest.raises(PlanError, match="7 primaries"):
        Plan("x", "1", "family", [0], 1, endpoints, {})
    plan = Plan("x", "1", "family", [0], 1, endpoints[:6], {"a": "b"})
    path = tmp_path / "x.plan.json"
    digest = write_plan(plan, path)
    import hashlib

    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_plan(path) == (plan, digest)


SCOPE = "in 5 families at 50 equal steps"
CLAIM = Claim(SCOPE, f"Weighting helped {SCOPE}.", f"Weighting against uniform: not significant {SCOPE}.",
              f"Uniform did better {SCOPE}.")  # fmt: skip


def test_a_plan_carries_each_primarys_claim_and_an_old_plan_keeps_its_bytes(tmp_path):
    claimed = Plan("x", "2", "family", [0], 2, [PrimaryEndpoint("e", "d", "b", "higher", claim=CLAIM)], {},
                   schema=CLAIMS_SCHEMA)  # fmt: skip
    path = tmp_path / "x.plan.json"
    write_plan(claimed, path)
    assert load_plan(path)[0] == claimed  # the claim survives the round trip
    assert json.loads(path.read_text())["primaries"][0]["claim"]["if_reversed"] == f"Uniform did better {SCOPE}."
    # a plan of schema 2 fixes every primary's claim; a sentence says its scope word for word
    with pytest.raises(PlanError, match=r"primaries \['e'\] have no claim sentences"):
        Plan("x", "2", "family", [0], 2, [PrimaryEndpoint("e", "d", "b", "higher")], {}, schema=CLAIMS_SCHEMA)
    with pytest.raises(PlanError, match="does not say its scope"):
        Claim(SCOPE, "Weighting helped.", f"Not significant {SCOPE}.", f"Uniform did better {SCOPE}.")
    # every committed plan written before claims serialises to its committed bytes (its hash is unchanged)
    for committed in sorted((ROOT / "docs" / "results").glob("*.plan.json")):
        plan, digest = load_plan(committed)
        assert plan.to_json() == committed.read_text() and sha256_of(committed) == digest


@pytest.mark.parametrize(
    ("mean", "survives", "said"),
    [(0.2, True, f"Weighting helped {SCOPE}."), (-0.2, True, f"Uniform did better {SCOPE}."),
     (0.2, False, f"Weighting against uniform: not significant {SCOPE}."),
     (-0.2, False, f"Weighting against uniform: not significant {SCOPE}.")],
)  # fmt: skip
def test_the_sentence_follows_holm_and_the_side_of_the_null(mean, survives, said):
    entry = {"mean": mean, "null": 0.0, "direction": "higher", "survives_holm": survives}
    assert FixedClaim(CLAIM, before_results=True).said(entry) == said
    lower = entry | {"mean": -mean, "direction": "lower"}  # a drift ratio: lower favours the method
    assert FixedClaim(CLAIM, before_results=True).said(lower) == said


def test_summary_and_holm_against_hand_computed_values():
    # per-unit values 1..5 against null 0: mean 3, sd sqrt(2.5), se 0.70711, t = 4.2426 on 4 df -> p = 0.0132356
    # (scipy.stats.ttest_1samp); t_0.975,4 = 2.776445, half-width 1.963243
    endpoint = PrimaryEndpoint("a", "d", "b", "higher")
    entry = summarise(endpoint, [[EndpointValue(v)] for v in (1.0, 2.0, 3.0, 4.0, 5.0)], primary=True)
    assert entry["p"] == pytest.approx(0.0132356, abs=1e-7)
    assert entry["ci95"] == pytest.approx([3 - 1.963243, 3 + 1.963243], abs=1e-6)
    other = summarise(endpoint, [[EndpointValue(v)] for v in (0.1, -0.2, 0.3, 0.0, 0.2)], primary=True)
    concordance = PrimaryEndpoint("c", "d", "no trend", "higher", null=0.5)
    flat = summarise(concordance, [[EndpointValue(0.5)]] * 5, primary=True)
    assert flat["p"] == 1.0 and flat["favours_method"] == 0  # no spread, mean at the null
    endpoints = {"a": entry, "b": other, "c": flat}
    correct(endpoints)
    # Holm by hand: p_a = 0.0132356 is smallest -> x3; p_b (0.46...) x2; p_c = 1 x1, each at least the previous
    assert endpoints["a"]["p_holm"] == pytest.approx(3 * 0.0132356, abs=1e-6) and endpoints["a"]["survives_holm"]
    assert endpoints["b"]["p_holm"] == pytest.approx(min(1.0, 2 * other["p"]))
    assert endpoints["c"]["p_holm"] == 1.0 and not endpoints["c"]["survives_holm"]


def test_an_undefined_unit_gives_no_interval_and_no_test():
    endpoint = PrimaryEndpoint("a", "d", "b", "lower")
    runs = [[EndpointValue(v)] for v in (-0.1, None, -0.3, -0.2, -0.4)]
    entry = summarise(endpoint, runs, primary=True)
    endpoints = {"a": entry}
    correct(endpoints)
    assert entry["ci95"] is None and entry["p"] is None and entry["p_holm"] is None and not entry["survives_holm"]
    assert entry["favours_method"] == 4 and entry["undefined_units"] == 1


def test_adapt_concordance_null_is_one_half_without_the_pinned_variant():
    from kinfolk.lab.methods.selection import depth_concordance, no_trend_concordance

    for depths in ([5, 6, 7, 8, 8], [5, 5, 5, 6, 7]):
        assert no_trend_concordance(depths, [0.4, 0.4, 0.1, 0.9, 0.3]) == 0.5
    # version 1: sizes ordered by k with k = M (KL 0 by construction) kept in: 5 of 15 pairs always concordant
    assert no_trend_concordance(range(6), [0.3, 0.2, 0.1, 0.05, 0.01, 0.0], False, pinned=5) == pytest.approx(2 / 3)
    # equal depths are not ordered: only the 5-vs-8 pairs count here, both favour depth
    assert depth_concordance([5, 8, 8], [0.1, 0.2, 0.3]) == 1.0
    assert depth_concordance([8, 8], [0.1, 0.2]) is None


def test_the_lab_imports_no_command():
    import ast

    offenders = []
    for path in sorted((ROOT / "kinfolk" / "lab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("kinfolk.commands")]
    assert offenders == []


def test_no_module_is_over_500_lines():
    """One idea per module: the installed package's and the repository's tools, benches, examples and tests alike."""
    installed = ("kinfolk", "plugins", "trainers", "callbacks", "eval_tasks")
    folders = (*installed, "tools", "bench", "examples", "tests", "tests_axolotl")
    long = {
        str(path.relative_to(ROOT)): n
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert long == {}


def test_no_atlas_ratio_is_computed_within_ten_times_a_floor():
    experiment = get_experiment("atlas")(results_dir=ROOT / "docs" / "results")
    record = experiment.load_run(0, 0)
    selection = experiment.select(SelectionView(record))
    unfloored = experiment.analyse(record, selection)["reverse/atlas vs lora: area"]
    assert unfloored.defined and unfloored.method > 0  # geometric-mean test KLs stand beside the ratio
    experiment.kl_floor = unfloored.method / 5  # ATLAS's KL lies within 10x of this floor
    floored = experiment.analyse(record, selection)["reverse/atlas vs lora: area"]
    assert floored.value is None and (floored.method, floored.baseline) == (unfloored.method, unfloored.baseline)


def test_the_lab_docstring_names_only_modules_that_exist():
    import re

    import kinfolk.lab

    folder_or_module = r"`([a-z_]+)(?:/(?:[^`]*/)?)?`"  # `name`, `name/` or `name/<...>/`, not `docs/x.md`
    named = set(re.findall(folder_or_module, kinfolk.lab.__doc__)) - {"build_family"}
    lab = ROOT / "kinfolk" / "lab"
    modules = {p.stem for p in lab.rglob("*.py")} | {p.parent.name for p in lab.rglob("__init__.py")}
    assert named - modules == set()
    assert {p.parent.name for p in lab.glob("*/__init__.py")} <= named  # and every folder is named
