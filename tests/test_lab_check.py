"""`kinfolk lab check`: every committed results file passes the protocol's rules, the rules' numbers agree with an
independent computation (SciPy's t distribution, Holm by hand), and a doctored copy fails naming its endpoint and
the rule it breaks."""

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from kinfolk.commands import main
from kinfolk.lab.protocol.checks import RULES, check_results, results_files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
COMMITTED = results_files(RESULTS)
SIDE_FILES = (".plan.json", ".claims-addendum.json")


def test_the_committed_results_are_found():
    names = {p.relative_to(RESULTS).as_posix() for p in COMMITTED}
    assert {"atlas.json", "real-atlas.json", "adapt-controls.json", "legacy/atlas.json"} <= names
    assert not any(name.endswith(".plan.json") or name.count("/") > 1 for name in names)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_every_committed_results_file_passes(path):
    check = check_results(path)
    assert check.passed, "\n".join(check.lines())
    # legacy records are the protocol-1 files, and only they: every other committed result has a plan
    assert check.kind == ("protocol-1" if path.parent.name == "legacy" else "protocol")


def test_the_command_checks_every_committed_file_by_default(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["lab", "check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ok (")[0] for line in lines] == [str(p.relative_to(ROOT)) for p in COMMITTED]


def test_intervals_p_values_and_holm_agree_with_scipy_and_a_hand_holm():
    """The numbers the checker demands are the textbook ones: a t-interval and t-test with U - 1 df, Holm by hand."""
    data = json.loads((RESULTS / "atlas.json").read_text())
    primaries = {name: e for name, e in data["endpoints"].items() if e["primary"]}
    p_values = {}
    for name, entry in primaries.items():
        values = entry["per_unit"]
        n = len(values)
        mean = sum(values) / n
        standard_error = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 / n**0.5
        half = scipy_stats.t.ppf(0.975, n - 1) * standard_error
        assert entry["ci95"] == pytest.approx([mean - half, mean + half], abs=1e-6)
        p_values[name] = 2 * scipy_stats.t.sf(abs(mean - entry["null"]) / standard_error, n - 1)
        assert entry["p"] == pytest.approx(p_values[name], rel=1e-6)
    ordered = sorted(p_values.values())
    steps = [min(1.0, (len(ordered) - k) * p) for k, p in enumerate(ordered)]
    holm_by_rank = [max(steps[: k + 1]) for k in range(len(steps))]
    for name, entry in primaries.items():
        expected = holm_by_rank[ordered.index(p_values[name])]
        assert entry["p_holm"] == pytest.approx(expected, rel=1e-6)
        assert entry["survives_holm"] == (expected < 0.05)


# ------------------------------------------------------------------------------------------------ doctored copies
def _doctored(
    tmp_path: Path, source: str, change: Callable[[dict], None], with_plan: bool = True, with_claims: bool = True
) -> Path:
    """A copy of a committed results file (with its committed plan and claims addendum beside it), changed by
    `change`."""
    data = json.loads((RESULTS / source).read_text())
    change(data)
    copy = tmp_path / Path(source).name
    copy.write_text(json.dumps(data, indent=2))
    if with_plan and "plan_sha256" in json.loads((RESULTS / source).read_text()):
        shutil.copyfile(RESULTS / f"{data['experiment']}.plan.json", tmp_path / f"{data['experiment']}.plan.json")
    addendum = RESULTS / f"{data.get('experiment')}.claims-addendum.json"
    if with_claims and addendum.is_file():  # the claim sentences written after the results, as committed
        shutil.copyfile(addendum, tmp_path / addendum.name)
    return copy


def _first_primary(data: dict) -> dict:
    return next(e for e in data["endpoints"].values() if e["primary"])


def _first_exploratory(data: dict) -> dict:
    return next(e for e in data["endpoints"].values() if not e["primary"])


def _set(entry_of: Callable[[dict], dict], key: str, value) -> Callable[[dict], None]:
    return lambda data: entry_of(data).__setitem__(key, value)


def _scale(entry_of: Callable[[dict], dict], key: str, factor: float) -> Callable[[dict], None]:
    return lambda data: entry_of(data).__setitem__(key, entry_of(data)[key] * factor)


def _flip_survival(data: dict) -> None:
    entry = _first_primary(data)
    entry["survives_holm"] = not entry["survives_holm"]


def _nudge_per_unit(data: dict) -> None:
    _first_primary(data)["per_unit"][0] += 0.05


def _nudge_interval(data: dict) -> None:
    _first_primary(data)["ci95"][1] += 1e-6


def _seventh_primary(data: dict) -> None:
    entry = _first_exploratory(data)
    entry.update(primary=True, p=0.01, p_holm=0.06, survives_holm=False)


def _exploratory_p(data: dict) -> None:
    _first_exploratory(data)["p"] = 0.001


def _drop(key: str, entry_of: Callable[[dict], dict] = lambda data: data) -> Callable[[dict], None]:
    return lambda data: entry_of(data).pop(key)


def _four_units(data: dict) -> None:
    data["units"] = data["units"][:4]


def _undefined_unit_with_interval(data: dict) -> None:
    entry = _first_primary(data)
    entry["per_unit"][0], entry["per_run"][0] = None, [None] * len(entry["per_run"][0])
    entry["undefined_units"] = 1


def _nudge_run(data: dict) -> None:
    _first_primary(data)["per_run"][0][0] += 0.01


def _atlas_floor(data: dict) -> None:  # the drift values behind this ratio are 0.005 to 0.04: a floor of 1e-3 bites
    data["endpoints"]["high: atlas vs lora, log drift ratio"]["floor"] = 1e-3


CONCORDANCE = "interpolation: accuracy concordance with depth"  # adapt-controls' t-interval ends above 1


def _bounded(clipped: bool) -> Callable[[dict], None]:
    """The concordance stated bounded to [0, 1], its interval clipped to it (as `summarise` writes a bounded
    statistic) or left as the t-interval."""

    def change(data: dict) -> None:
        entry = data["endpoints"][CONCORDANCE]
        entry["range"] = [0.0, 1.0]
        if clipped:
            entry["ci95"] = [max(entry["ci95"][0], 0.0), min(entry["ci95"][1], 1.0)]

    return change


def _rename_first_primary(data: dict) -> None:  # a primary that no claim names (nor the plan)
    data["endpoints"] = {("renamed" if e is _first_primary(data) else n): e for n, e in data["endpoints"].items()}


def _legacy_interval(data: dict) -> None:
    next(e for e in data["endpoints"].values() if e["ci95"])["ci95"][0] -= 0.001


def _name(source: str, pick: Callable[[dict], dict]) -> str:
    data = json.loads((RESULTS / source).read_text())
    entry = pick(data)
    return next(name for name, e in data["endpoints"].items() if e is entry)


FIRST_PRIMARY = _name("atlas.json", _first_primary)
FIRST_EXPLORATORY = _name("atlas.json", _first_exploratory)
LEGACY_WITH_INTERVAL = _name("legacy/atlas.json", lambda data: next(e for e in data["endpoints"].values() if e["ci95"]))  # fmt: skip

# (what is done, the committed file it is done to, the change, the endpoint named, the rule broken)
DOCTORED = [
    ("a per-unit value moved", "atlas.json", _nudge_per_unit, FIRST_PRIMARY, "interval"),
    ("a per-unit value moved", "atlas.json", _nudge_per_unit, FIRST_PRIMARY, "p-value"),
    ("a per-unit value moved", "atlas.json", _nudge_per_unit, FIRST_PRIMARY, "unit-values"),
    ("an interval's bound off by 1e-6", "atlas.json", _nudge_interval, FIRST_PRIMARY, "interval"),
    ("a run's value moved", "atlas.json", _nudge_run, FIRST_PRIMARY, "unit-values"),
    ("a wrong p-value", "atlas.json", _scale(_first_primary, "p", 1.001), FIRST_PRIMARY, "p-value"),
    ("a wrong Holm p", "atlas.json", _scale(_first_primary, "p_holm", 1.001), FIRST_PRIMARY, "holm"),
    ("survives_holm flipped", "atlas.json", _flip_survival, FIRST_PRIMARY, "holm"),
    ("a wrong mean", "atlas.json", _scale(_first_primary, "mean", 1.01), FIRST_PRIMARY, "mean"),
    ("a wrong sign count", "atlas.json", _set(_first_primary, "favours_method", 2), FIRST_PRIMARY, "favours"),
    ("a seventh primary", "atlas.json", _seventh_primary, None, "primaries"),
    ("a seventh primary", "atlas.json", _seventh_primary, None, "plan"),
    ("an exploratory endpoint tested", "atlas.json", _exploratory_p, FIRST_EXPLORATORY, "exploratory"),
    ("the plan hash dropped", "atlas.json", _drop("plan_sha256"), None, "plan-hash"),
    ("the plan hash altered", "atlas.json", _set(lambda d: d, "plan_sha256", "0" * 64), None, "plan-hash"),
    ("the results of another version", "atlas.json", _set(lambda d: d, "version", "9"), None, "plan"),
    ("four units", "atlas.json", _four_units, None, "units"),
    ("an interval with an undefined unit", "atlas.json", _undefined_unit_with_interval, FIRST_PRIMARY, "interval"),
    ("two runs per seed", "real-atlas.json", _set(lambda d: d, "runs_per_unit", 2), None, "runs-per-unit"),
    ("one run per family", "atlas-controls.json", _set(lambda d: d, "runs_per_unit", 1), None, "runs-per-unit"),
    ("a ratio within 10x of its floor", "real-atlas.json", _atlas_floor, "high: atlas vs lora, log drift ratio",
     "floor"),
    ("no floor stated", "atlas.json", _drop("floor", _first_primary), FIRST_PRIMARY, "floor"),
    ("no grid-edge flag", "atlas.json", _drop("grid_edge", _first_primary), FIRST_PRIMARY, "grid-edge"),
    ("a grid-edge flag that is not a flag", "atlas.json", _set(_first_primary, "grid_edge", None), FIRST_PRIMARY,
     "grid-edge"),
    ("no absolute values", "atlas.json", _drop("absolute", _first_primary), FIRST_PRIMARY, "absolute"),
    ("a legacy interval moved", "legacy/atlas.json", _legacy_interval, LEGACY_WITH_INTERVAL, "interval"),
    ("a bounded interval not clipped", "adapt-controls.json", _bounded(clipped=False), CONCORDANCE, "interval"),
    ("a primary no claim names", "atlas.json", _rename_first_primary, None, "claims"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("source", "change", "endpoint", "rule"),
    [case[1:] for case in DOCTORED],
    ids=[f"{case[0]}: {case[4]}" for case in DOCTORED],
)
def test_a_doctored_copy_fails_naming_endpoint_and_rule(tmp_path, capsys, source, change, endpoint, rule):
    copy = _doctored(tmp_path, source, change)
    assert main(["lab", "check", str(copy)]) == 2
    lines = capsys.readouterr().out.splitlines()
    where = f"endpoint {endpoint!r} " if endpoint is not None else ""
    assert any(line.startswith(f"{copy}: {where}breaks {rule}: ") for line in lines), lines
    assert all(line.split(": ")[0] == str(copy) and " breaks " in line for line in lines)
    assert any((f.endpoint, f.rule) == (endpoint, rule) for f in check_results(copy).findings)


def test_an_undoctored_copy_passes(tmp_path):
    """The doctored copies fail for their change, not for being copies."""
    for source in ("atlas.json", "real-atlas.json", "legacy/atlas.json"):
        assert check_results(_doctored(tmp_path, source, lambda data: None)).passed


def test_a_bounded_statistics_interval_clipped_to_its_range_passes(tmp_path):
    copy = _doctored(tmp_path, "adapt-controls.json", _bounded(clipped=True))
    assert json.loads(copy.read_text())["endpoints"][CONCORDANCE]["ci95"][1] == 1.0  # the t-interval's end was 1.068
    assert check_results(copy).passed


def test_a_missing_or_changed_plan_file_breaks_the_plan_hash(tmp_path):
    copy = _doctored(tmp_path, "atlas.json", lambda data: None, with_plan=False)
    assert [(f.rule, f.endpoint) for f in check_results(copy).findings] == [("plan-hash", None)]
    plan = tmp_path / "atlas.plan.json"
    plan.write_bytes((RESULTS / "atlas.plan.json").read_bytes() + b"\n")  # same plan, other bytes
    findings = check_results(copy).findings
    assert [(f.rule, f.endpoint) for f in findings] == [("plan-hash", None)]
    assert "atlas.plan.json" in findings[0].message


def test_legacy_results_belong_in_the_legacy_folder(tmp_path):
    results_dir = tmp_path / "docs" / "results"
    results_dir.mkdir(parents=True)
    shutil.copyfile(RESULTS / "legacy" / "atlas.json", results_dir / "atlas.json")
    assert [f.rule for f in check_results(results_dir / "atlas.json").findings] == ["legacy"]


def test_a_passing_and_a_failing_file_one_line_each_and_exit_2(tmp_path, capsys):
    doctored = _doctored(tmp_path, "atlas.json", _set(_first_primary, "p_holm", 0.5))
    assert main(["lab", "check", str(RESULTS / "adapt.json"), str(doctored)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{RESULTS / 'adapt.json'}: ok (5 family units")
    assert lines[1:] == [
        f"{doctored}: endpoint {FIRST_PRIMARY!r} breaks holm: p_holm 0.5, Holm over the primaries gives "
        f"{json.loads((RESULTS / 'atlas.json').read_text())['endpoints'][FIRST_PRIMARY]['p_holm']!r}"
    ]


def test_a_plan_or_a_file_that_is_not_json_is_refused(tmp_path, capsys):
    assert main(["lab", "check", str(RESULTS / "atlas.plan.json")]) == 2
    assert "breaks format: a plan" in capsys.readouterr().out
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["lab", "check", str(broken)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"kinfolk lab: error: {broken}: not JSON") and "\n" not in error


def test_primaries_without_claim_sentences_fail_each_by_name(tmp_path):
    copy = _doctored(tmp_path, "atlas.json", lambda data: None, with_claims=False)
    primaries = [n for n, e in json.loads(copy.read_text())["endpoints"].items() if e["primary"]]
    findings = check_results(copy).findings
    assert {f.rule for f in findings} == {"claims"} and len(findings) == len(primaries) == 6
    assert all(
        f"primary endpoint {name!r} has no claim sentences" in f.message for f, name in zip(findings, primaries)
    )
    # an addendum that does not say it was written after the results, or names another plan, counts for nothing
    addendum = json.loads((RESULTS / "atlas.claims-addendum.json").read_text())
    for key, value in (("written", "before the results"), ("plan_sha256", "0" * 64)):
        (tmp_path / "atlas.claims-addendum.json").write_text(json.dumps(addendum | {key: value}))
        messages = [f.message for f in check_results(copy).findings]
        assert any(m.startswith(f"atlas.claims-addendum.json: {key!r} is ") for m in messages), messages
        assert sum("has no claim sentences" in m for m in messages) == 6


def _checkout(tmp_path: Path) -> Path:
    """A copy of this checkout's results folder (plans and addenda, no per-unit records), README and results page."""
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    for path in RESULTS.glob("*.json"):
        shutil.copyfile(path, results / path.name)
    shutil.copytree(RESULTS / "legacy", results / "legacy")
    for name in ("README.md", "docs/results.md"):
        shutil.copyfile(ROOT / name, tmp_path / name)
    return results


def test_a_stale_readme_table_or_results_page_fails_the_check(tmp_path, capsys):
    results = _checkout(tmp_path)
    assert main(["lab", "check", "--results_dir", str(results)]) == 0
    capsys.readouterr()
    readme, page = tmp_path / "README.md", tmp_path / "docs" / "results.md"
    fresh = readme.read_text()
    # a hand-edited sentence in the README's generated table
    readme.write_text(fresh.replace("not significant after Holm's correction", "shown", 1))
    assert main(["lab", "check", "--results_dir", str(results)]) == 2
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{readme}: its generated part is stale: run python tools/results_page.py (breaks generated)"
    )
    readme.write_text(fresh)
    # a result changed after the page was generated: the page's block no longer matches its JSON
    data = json.loads((results / "real-atlas.json").read_text())
    data["notes"] = [*data.get("notes", []), "a note added after the page was generated"]
    (results / "real-atlas.json").write_text(json.dumps(data))
    assert main(["lab", "check", "--results_dir", str(results)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"{page}: its generated part is stale: run python tools/results_page.py (breaks generated)"
    assert not any(line.startswith(str(readme)) for line in lines)  # notes are not in the README's table


def test_the_repository_tool_regenerates_a_stale_checkout_and_writes_nowhere_else(tmp_path, monkeypatch):
    from tools.results_page import main as regenerate_checkout

    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    elsewhere.mkdir()
    results = _checkout(checkout)
    readme, page = checkout / "README.md", checkout / "docs" / "results.md"
    fresh_readme, fresh_page = readme.read_text(), page.read_text()
    readme.write_text(fresh_readme.replace("not significant after Holm's correction", "shown", 1))
    block = re.compile(r"(<!-- results:([\w-]+) -->\n).*?(\n<!-- /results:\2 -->)", flags=re.DOTALL)
    page.write_text(block.sub(r"\1stale\3", fresh_page, count=1))
    monkeypatch.chdir(elsewhere)
    assert regenerate_checkout(["--root", str(checkout)]) == 0
    assert (readme.read_text(), page.read_text()) == (fresh_readme, fresh_page)  # the committed ones are fresh
    planned = [json.loads(p.read_text()) for p in results.glob("*.json") if not p.name.endswith(SIDE_FILES)]
    figures = {f"{r['experiment']}-primaries.png" for r in planned if r.get("plan_sha256")}
    assert {p.name for p in results.glob("*.png")} == figures and len(figures) >= 5
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in results.glob("*.png"))
    assert list(elsewhere.iterdir()) == []


def test_no_results_files_is_bad_input(tmp_path, capsys):
    assert main(["lab", "check", "--results_dir", str(tmp_path)]) == 2
    assert f"{tmp_path}: no results files here" in capsys.readouterr().err


def test_every_rule_is_stated():
    assert all(statement and not statement.endswith(".") for statement in RULES.values())
    rules_under_test = {case[4] for case in DOCTORED} | {"legacy", "format", "generated"}
    assert rules_under_test == set(RULES)


def test_the_lab_help_lists_check_and_check_has_its_own_help(capsys):
    assert main(["lab", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: kinfolk lab {build,experiment,check}")
    with pytest.raises(SystemExit) as exit_info:
        main(["lab", "check", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: kinfolk lab check [-h] [--results_dir RESULTS_DIR] [FILE ...]")


def test_the_pages_keep_every_concordance_interval_in_its_range():
    """A concordance lies in [0, 1]: on the results page and in README no interval of one leaves it (protocol
    version 3), whether its results clipped it or its claims addendum states the range after the fact."""
    import re

    for name in ("docs/results.md", "README.md"):
        for line in (ROOT / name).read_text().splitlines():
            if "concordance" in line:
                ends = [float(v) for pair in re.findall(r"\[([-+]?[\d.]+), ([-+]?[\d.]+)\]", line) for v in pair]
                assert all(0.0 <= end <= 1.0 for end in ends), (name, line[:100])
