"""The reliability matrix: every output path of every verb that writes, against every output-path case.

One table, `OUTPUTS`, names each verb's output options (`--out`, `--output_dir`, `--cache_dir`, ...), the files a
run creates beside them (the side log `NAME.run.log`, a report) and how it runs; the cheap cases below are
parametrised over all of it, so an output or a side file added to the table is checked by every case:

- `under a file`: the option names a path under a regular file;
- `unwritable`: the option names a path that cannot be created (`/proc`, where even root cannot create a file);
- `exists`: the output exists and `--overwrite` is not given;
- `overwrite, run fails`: `--overwrite` over an old output, and the run fails after the checks;
- `interrupted`: SIGTERM after the checks: the one line names the side log (before the resume command).

Each runs `kinfolk.commands.main` in this process with the verb's expensive part (a model load, lm-eval, `accelerate
launch`, a family build) replaced by a stub that fails the test if a refusal has not come first; refused cases
must exit 2 with one line naming the path given, leave nothing at or beside it and never open the side log. The
heavy cases (SIGKILL and SIGTERM mid-write, a full disk, truncated inputs) have their own tests: the table points to
them and `test_the_heavy_cases_the_table_points_to_exist` keeps the pointers true. `docs/reliability.md` holds the
table rendered by `matrix_markdown` (`python tests/test_reliability_matrix.py` rewrites it).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from refusal_helpers import assert_command_refused, snapshot

from kinfolk import console
from kinfolk.interrupt import Interrupted
from kinfolk.testing import prompt_completion_dataset

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
UNWRITABLE = Path("/proc/kinfolk-matrix")  # procfs refuses new files to every user, root included
TESTED = "tested"
NO_LOG = "no side log"

# --- the table -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """One output path of one verb.

    `argv` is the verb's command line writing this output to `{out}`, everything else valid (the `inputs` fixture's
    paths); `beside(path)` the files the run creates next to it (side log, reports); `exists`, `overwrite` and
    `interrupted` are TESTED or why that case does not apply (the cells of docs/reliability.md's table); `work` is
    the attribute whose call starts the expensive part; `heavy` maps each heavy case to the test that covers it.
    """

    verb: str
    option: str
    name: str
    argv: str
    work: str
    beside: Callable[[Path], list[Path]] = lambda path: []
    exists: str = TESTED
    overwrite: str = TESTED
    interrupted: str = TESTED
    heavy: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.verb} {self.option}"

    def command(self, inputs: dict, out: Path) -> list[str]:
        return [part.format(out=out, **inputs) for part in self.argv.split()]


def run_log(path: Path) -> list[Path]:
    """The side log beside a file or folder output: `scored.jsonl` -> `scored.run.log`, `student/` ->
    `student.run.log` (the table's names hold no other dot)."""
    return [path.parent / f"{path.name.split('.')[0]}.run.log"]


MERGE_OPS = ("init-student", "delta", "apply-delta", "patch", "interpolate")
KILL = "test_kill_and_resume.py"
TERM = "test_interrupts.py"
DISK = "test_disk_space.py"
BAD = "test_bad_inputs_commands.py"
BAD_LM_EVAL = "test_bad_inputs_lm_eval.py"
MERGE_CASES = f"{BAD}::test_merge_refuses_bad_configs_and_inputs"
MERGE_HEAVY = {  # every op writes through one writer (`kinfolk.plugins.adapt.execute`); each test runs the op named
    "init-student": {
        "full disk": f"{DISK}::test_a_disk_that_fills_during_a_merge_is_one_line_and_leaves_nothing",
        "truncated inputs": MERGE_CASES,
    },
    "delta": {"truncated inputs": MERGE_CASES},
    "patch": {
        "SIGKILL mid-write": f"{KILL}::test_killed_patch_all_leaves_a_whole_or_no_output_and_the_rerun_cleans_up",
        "SIGTERM": f"{TERM}::test_an_interrupted_patch_all_leaves_nothing_and_its_command_reruns",
        "full disk": f"{DISK}::test_patch_all_refuses_with_the_size_of_every_model",
        "truncated inputs": MERGE_CASES,
    },
    "interpolate": {"truncated inputs": MERGE_CASES},
}
CACHE = "n/a (a cache, not a result)"
REUSED_FAMILIES = "reused: the families trained to their end are loaded"
AS_OUT = "as for `--out` (the log goes there)"
SCORE = "score --data {data} --large_base {teacher} --small_base {small} --reference {reference}"
LAB_CACHE = "--cache_dir {root}/lab-cache"

# fmt: off
OUTPUTS: list[Output] = [
    Output(
        "score", "--out", "scored.jsonl", f"{SCORE} --out {{out}} --cache_dir {{root}}/score-cache",
        "kinfolk.plugins.atlantis.scoring.load_model",
        beside=lambda path: [*run_log(path), path.with_name(f"{path.stem}.weights_report.json")],
        heavy={
            "SIGKILL mid-write": f"{KILL}::test_killed_scoring_resumes_from_whole_chunks_and_equals_an_uninterrupted_run",
            "SIGTERM": f"{TERM}::test_an_interrupted_score_says_what_it_keeps_and_its_rerun_resumes_from_the_cache",
            "full disk": f"{DISK}::test_score_refuses_before_reading_its_data_when_the_output_does_not_fit",
            "truncated inputs": f"{BAD}::test_score_refuses_bad_data_naming_the_file",
            "truncated cache": "test_reliability_matrix.py::test_a_damaged_score_cache_chunk_is_named_then_rescored",
        },
    ),
    Output(
        "score", "--cache_dir", "score-cache", f"{SCORE} --out {{root}}/scored.jsonl --cache_dir {{out}}",
        "kinfolk.plugins.atlantis.scoring.load_model",
        exists="reused: a rerun scores only the chunks it lacks", overwrite=CACHE, interrupted=AS_OUT,
    ),
    *(
        Output(f"merge {op}", "--out", op, f"merge {op} {{root}}/{op}.yaml --out {{out}} --no-progress",
               "kinfolk.plugins.adapt.execute.materialise", beside=run_log, heavy=MERGE_HEAVY.get(op, {}))
        for op in MERGE_OPS
    ),
    Output(
        "merge delta-cosine", "--out", "cosine.json", "merge delta-cosine {root}/delta-cosine.yaml --out {out}",
        "kinfolk.plugins.adapt.cosine.delta_cosine", interrupted=NO_LOG,
    ),
    Output(
        "sft", "--output_dir", "sft-run",
        "sft --model_name_or_path {small} --dataset_name {data} --output_dir {out} --use_peft",
        "kinfolk.commands.sft.launch",
        overwrite="cleared after the checks, then trained again (checkpoints publish atomically)", interrupted=NO_LOG,
        heavy={
            "SIGKILL mid-write": f"{KILL}::test_killed_checkpointing_leaves_whole_checkpoints_and_resumes_bit_exact",
            "SIGTERM": f"{TERM}::test_an_interrupted_sft_says_it_keeps_its_checkpoints_and_resumes_from_the_last",
            "full disk": f"{DISK}::test_sft_full_fine_tuning_refuses_before_launching_when_model_and_checkpoints_do_not_fit",
            "truncated inputs": "test_bad_inputs_sft.py::test_sft_refuses_bad_data_weights_models_and_adapters",
        },
    ),
    Output(
        "distil", "--out", "distilled", "distil --teacher {teacher} --sft_data {data} --out {out}",
        "kinfolk.commands.distil.launch",
        beside=lambda path: [path / console.LOG_FILE],
        overwrite="cleared after the checks, then distilled again (each part publishes atomically)",
        heavy={
            "SIGTERM": f"{TERM}::test_an_interrupted_distil_stops_its_processes_and_resumes_from_the_last_checkpoint",
            "full disk": f"{DISK}::test_distil_refuses_before_launching_when_student_checkpoints_and_delta_do_not_fit",
            "truncated inputs": "test_distil_cli.py::test_bad_teachers_data_and_checkpoints_are_refused_before_any_process_starts",
        },
    ),
    Output(
        "lab build", "--cache_dir", "lab-cache", "lab build --quick --cache_dir {out}",
        "kinfolk.lab.world.family.build_family",
        beside=lambda path: run_log(path / quick_family_key()),
        exists="reused: the models trained to their end are loaded", overwrite="n/a (`--force` retrains in place)",
        heavy={
            "SIGTERM": f"{TERM}::test_an_interrupted_lab_build_keeps_the_trained_models_and_resumes_after_them",
            "full disk": f"{DISK}::test_lab_build_refuses_before_training_when_the_family_does_not_fit",
        },
    ),
    Output(
        "lab experiment", "--work", "protocol-work", "lab experiment atlantis analyse --work {out}",
        "kinfolk.lab.protocol.actions.run_experiment",
        exists="reused: the records made under this plan are read back", overwrite="n/a (no `--overwrite`)",
        interrupted=NO_LOG,
        heavy={"SIGTERM": f"{TERM}::test_an_interrupted_lab_experiment_keeps_finished_runs_and_resumes_from_them"},
    ),
    Output(
        "demo", "--cache_dir", "lab-cache", "demo --quick --out {root}/demo --cache_dir {out}",
        "kinfolk.lab.demo.pipeline.run_demo", exists=REUSED_FAMILIES, overwrite=CACHE, interrupted=AS_OUT,
    ),
    Output(
        "demo", "--out", "demo", f"demo --quick --out {{out}} {LAB_CACHE}", "kinfolk.lab.demo.pipeline.run_demo",
        beside=lambda path: [path / console.LOG_FILE],
        overwrite="n/a (the stages write into `--out`, so a stopped demo resumes there)",
    ),
    Output(
        "drift", "--out", "drift-report", "drift --target score --method atlas --run atlas 1 {root} --out {out}",
        "kinfolk.commands.drift.load_run", interrupted=NO_LOG,
        heavy={"truncated inputs": f"{BAD}::test_drift_refuses_bad_runs_and_options_in_one_line"},
    ),
    Output(
        "compare", "--out", "compare",
        "compare --model_name_or_path {small} --dataset_name {data} --dataset_validation_split train"
        " --retained_dataset_name {data} --retained_kl_split train --out {out}",
        "kinfolk.compare.grid.run_grid", beside=lambda path: [path / console.LOG_FILE],
        exists="reused: finished runs (their run.json) are skipped, an interrupted one resumes from its last "
        "checkpoint; one trained under other settings is refused",
        overwrite="n/a (no `--overwrite`: a rerun resumes)",
        heavy={
            "truncated inputs": "test_compare.py::test_bad_input_is_one_line_and_exit_2_before_any_model_loads",
            "SIGKILL mid-write": f"{KILL}::test_a_killed_compare_run_resumes_from_its_last_checkpoint_and_equals_an_uninterrupted_one",
        },
    ),
    Output(
        "churn", "--out", "churn.json", "churn {data} {data} --out {out}", "kinfolk.commands.churn.read_samples",
        interrupted=NO_LOG, heavy={"truncated inputs": f"{BAD_LM_EVAL}::test_churn_refuses_bad_sample_files_naming_them"},
    ),
    Output(
        "route", "--out", "routing", "route --outcomes {data} --out {out}",
        "kinfolk.plugins.adapt.outcomes.read_outcomes", interrupted=NO_LOG,
        heavy={"truncated inputs": "test_adapt_routing.py::test_kinfolk_route_refuses_bad_rows_in_one_line_naming_the_file"},
    ),
    Output(
        "eval", "--output_path", "eval-results",
        "eval --model hf --model_args pretrained={small} --device cpu --skip_default_tasks --tasks kinfolk_csqa_sample"
        " --output_path {out}",
        "lm_eval.evaluator.simple_evaluate",
        exists="kept: lm-eval adds a results file named by the time", overwrite="n/a (no `--overwrite`)",
        interrupted=NO_LOG,
        heavy={"truncated inputs": f"{BAD_LM_EVAL}::test_eval_refuses_bad_models_adapters_tasks_and_paths_before_loading"},
    ),
]
# fmt: on

CASES = ("under a file", "unwritable", "exists", "overwrite, run fails", "interrupted")
HEAVY_CASES = ("SIGKILL mid-write", "SIGTERM", "full disk", "truncated inputs", "truncated cache")


def quick_family_key() -> str:
    from kinfolk.lab.world.family import LabConfig

    return LabConfig.quick_config(seed=0).cache_key()


CASE_FIELDS = {"exists": "exists", "overwrite, run fails": "overwrite", "interrupted": "interrupted"}


def cell(output: Output, case: str) -> str:
    """TESTED, or why `case` does not apply to `output`."""
    return getattr(output, CASE_FIELDS[case]) if case in CASE_FIELDS else TESTED


def matrix_markdown() -> str:
    """The two tables of docs/reliability.md's matrix section: the cheap cases, then where the heavy ones are."""
    lines = ["| verb | output | " + " | ".join(CASES) + " |", "|---" * (2 + len(CASES)) + "|"]
    for output in OUTPUTS:
        lines.append(f"| `{output.verb}` | `{output.option}` | " + " | ".join(cell(output, c) for c in CASES) + " |")
    lines += ["", "| verb | " + " | ".join(HEAVY_CASES) + " |", "|---" * (1 + len(HEAVY_CASES)) + "|"]
    heavy: dict[str, dict[str, str]] = {}
    for output in OUTPUTS:
        heavy.setdefault(output.verb, {}).update(output.heavy)
    for verb, tests in heavy.items():
        cells = [f"`{tests[case].split('::')[0]}`" if case in tests else "—" for case in HEAVY_CASES]
        lines.append(f"| `{verb}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- fixtures ------------------------------------------------------------------------------------------------------


class WorkStarted(RuntimeError):
    """A verb's expensive part started (the stubs raise it)."""


@pytest.fixture(scope="module")
def inputs(tiny_kit, tmp_path_factory) -> dict:
    """Valid inputs for every verb: the tiny Llama family, a data file and one merge config per operation."""
    from kinfolk.plugins.adapt import merge

    root = tmp_path_factory.mktemp("matrix-inputs")
    family = tiny_kit.family("llama")
    prompt_completion_dataset(6).to_json(str(root / "train.jsonl"))
    teacher = str(family["large_base"])
    student = merge({"op": "init-student", "teacher": teacher, "layers": {"every": 2}}, root / "student")
    delta = merge({"op": "delta", "init": str(student), "distilled": str(student)}, root / "delta")
    configs = {
        "init-student": {"teacher": teacher, "layers": {"every": 2}},
        "delta": {"init": str(student), "distilled": str(student)},
        "apply-delta": {"init": str(student), "delta": str(delta)},
        "patch": {"teacher": teacher, "student": str(student), "num_patched": 1},
        "interpolate": {"a": str(student), "b": str(student), "alpha": 0.5},
        "delta-cosine": {"a": str(delta), "b": str(delta)},
    }
    for op, fields in configs.items():
        (root / f"{op}.yaml").write_text(json.dumps(fields))
    return {"root": root, "data": root / "train.jsonl", "teacher": teacher, "small": family["small_base"],
            "reference": family["small_instruct"]}  # fmt: skip


@pytest.fixture
def logs_opened(monkeypatch) -> list[Path]:
    """The side logs `kinfolk.console.quiet` opens during the test, in order."""
    opened, routed = [], console._routed

    def recording(log_path, *args, **kwargs):
        opened.append(Path(log_path))
        return routed(log_path, *args, **kwargs)

    monkeypatch.setattr(console, "_routed", recording)
    return opened


def block_work(monkeypatch, output: Output, error: BaseException) -> None:
    """The verb's expensive part raises `error` (for a refusal: it must never be reached)."""
    module, _, name = output.work.rpartition(".")

    def stub(*args, **kwargs):
        raise error

    if output.verb == "eval":
        # first: lm_eval's package attribute is lazy (its __getattr__ reads lm_eval.evaluator), so patched after the
        # evaluator it would record the stub as the value to restore, and leak it into every later test
        monkeypatch.setattr("lm_eval.simple_evaluate", stub)
    monkeypatch.setattr(f"{module}.{name}", stub)


def params(case: str):
    return [pytest.param(output, id=output.label) for output in OUTPUTS if cell(output, case) == TESTED]


def case_dir(tmp_path: Path, output: Output) -> Path:
    """Where a case puts this output: a fresh folder beside nothing else."""
    folder = tmp_path / "case"
    folder.mkdir()
    return folder / output.name


def refuse(output, inputs, monkeypatch, path, logs_opened, *named, existing=None):
    block_work(monkeypatch, output, WorkStarted(f"{output.work} ran before {path} was refused"))
    line = assert_command_refused(
        output.command(inputs, path),
        *named,
        destination=None if existing else path,
        beside=output.beside(path),
        inputs=[existing] if existing else [],
    )
    assert ".run.log" not in line, line
    assert logs_opened == [], f"the side log was opened before the refusal: {logs_opened}"


# --- the cheap cases -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("output", params("under a file"))
def test_an_output_under_a_regular_file_is_refused_naming_it(output, inputs, tmp_path, monkeypatch, logs_opened):
    plain = tmp_path / "plainfile"
    plain.write_text("a file, not a folder")
    path = plain / output.name
    refuse(output, inputs, monkeypatch, path, logs_opened, path, "is a file")
    assert plain.read_text() == "a file, not a folder"


@pytest.mark.parametrize("output", params("unwritable"))
def test_an_output_that_cannot_be_created_is_refused_naming_it(output, inputs, monkeypatch, logs_opened):
    path = UNWRITABLE / output.name
    refuse(output, inputs, monkeypatch, path, logs_opened, path)


@pytest.mark.parametrize("output", params("exists"))
def test_an_existing_output_is_refused_without_overwrite(output, inputs, tmp_path, monkeypatch, logs_opened):
    path = case_dir(tmp_path, output)
    make_old_output(path)
    refuse(output, inputs, monkeypatch, path, logs_opened, path, existing=path)


def make_old_output(path: Path) -> None:
    if path.suffix:
        path.write_text('{"old": true}\n')
    else:
        path.mkdir()
        (path / "old.json").write_text('{"old": true}\n')


@pytest.mark.parametrize("output", params("overwrite, run fails"))
def test_overwrite_keeps_the_old_output_whole_when_the_run_fails_after_the_checks(
    output, inputs, tmp_path, monkeypatch, logs_opened
):
    """The new output replaces the old one in one rename (or exchange) at its end: a run that fails before it has
    left the old output byte-identical, no staging beside it, and its side log (opened after the checks)."""
    path = case_dir(tmp_path, output)
    make_old_output(path)
    before = snapshot([path])
    block_work(monkeypatch, output, WorkStarted("the work failed"))
    with pytest.raises(WorkStarted), contextlib.redirect_stderr(io.StringIO()):
        from kinfolk.commands import main

        main([str(argument) for argument in [*output.command(inputs, path), "--overwrite"]])
    assert snapshot([path]) == before
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")] == []
    assert logs_opened == [log for log in output.beside(path) if log.name.endswith(console.LOG_FILE)]


@pytest.mark.parametrize("output", params("interrupted"))
def test_an_interrupted_run_names_its_side_log(output, inputs, tmp_path, monkeypatch, logs_opened):
    path = case_dir(tmp_path, output)
    block_work(monkeypatch, output, Interrupted(signal.SIGTERM))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        from kinfolk.commands import main

        code = main([str(argument) for argument in output.command(inputs, path)])
    (log,) = [log for log in output.beside(path) if log.name.endswith(console.LOG_FILE)]
    line = stderr.getvalue().strip().splitlines()[-1]
    assert code == 143, stderr.getvalue()
    assert line.startswith(f"kinfolk {output.verb.split()[0]}: stopped by SIGTERM; kept: "), line
    assert f"; log: {log}; resume: kinfolk {output.verb.split()[0]} " in line, line
    assert logs_opened[-1] == log and log.is_file()
    # distil's source checks log to a scratch file before `--out` may be cleared, joined into `log` and gone
    assert not any(early.exists() for early in logs_opened[:-1]), logs_opened


# --- the score cache: a damaged chunk is named, then scored again --------------------------------------------------


def cached_chunks(cache: Path) -> dict[str, list[Path]]:
    """Each model's cache directory (by its meta.json role) and its chunks."""
    found = {}
    for meta in cache.glob("*/meta.json"):
        found[json.loads(meta.read_text())["role"]] = sorted(meta.parent.glob("chunk-*.npz"))
    return found


@pytest.mark.parametrize("damage", ["truncated", "inputs changed"])
def test_a_damaged_score_cache_chunk_is_named_then_rescored(inputs, tmp_path, damage):
    """`kinfolk score` over a cache with one damaged chunk warns on the terminal with the chunk's file, its number
    and the rows scored again, then scores only those rows: the output equals the first run's."""
    from kinfolk.commands import main

    cache = tmp_path / "cache"
    first = tmp_path / "first.jsonl"
    argv = [*OUTPUTS[0].command(inputs, first), "--chunk_rows", "2"]
    argv[argv.index("--cache_dir") + 1] = cache
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert main([str(a) for a in argv]) == 0
    chunk = cached_chunks(cache)["small_base"][1]
    with np.load(chunk) as stored:
        rows = sorted(stored["rows"].tolist())
    if damage == "truncated":
        chunk.write_bytes(chunk.read_bytes()[:-40])
    else:  # another model's chunk of the same rows: readable, but not computed from these inputs
        chunk.write_bytes(cached_chunks(cache)["reference"][1].read_bytes())
    second = tmp_path / "second.jsonl"
    argv[argv.index("--out") + 1] = second
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        assert main([str(a) for a in argv]) == 0
    text = " ".join(stderr.getvalue().split())  # the warning may wrap; its words are all there
    warnings = [line for line in stderr.getvalue().splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, stderr.getvalue()
    assert f"score cache chunk 1 ({chunk})" in text, text
    expected = "cannot be read back" if damage == "truncated" else "was computed from other inputs"
    assert expected in text and f"scoring its rows again ({len(rows)} rows: {rows})" in text, text
    assert f"resuming: {6 - len(rows)} of 6 rows scored with the small_base model" in text, text  # only those
    first_rows = [json.loads(line) for line in first.read_text().splitlines()]
    second_rows = [json.loads(line) for line in second.read_text().splitlines()]
    assert second_rows == first_rows


# --- the table, its references and the document --------------------------------------------------------------------


def test_every_verb_that_writes_is_in_the_table():
    from kinfolk.commands import VERBS

    writes = set(VERBS) - {"env"}  # env prints and writes nothing
    assert writes == {output.verb.split()[0] for output in OUTPUTS}
    assert {f"merge {op}" for op in (*MERGE_OPS, "delta-cosine")} <= {output.verb for output in OUTPUTS}


def test_the_heavy_cases_the_table_points_to_exist():
    for output in OUTPUTS:
        for case, reference in output.heavy.items():
            assert case in HEAVY_CASES, case
            file, test = reference.split("::")
            assert re.search(rf"^def {test}\(", (ROOT / "tests" / file).read_text(), re.M), reference


BLOCK = re.compile(r"(<!-- matrix:begin.*?-->\n)(.*?)\n?(<!-- matrix:end -->)", re.S)


def documented_block(text: str) -> str:
    match = BLOCK.search(text)
    assert match, "docs/reliability.md lacks the <!-- matrix:begin --> ... <!-- matrix:end --> block"
    return match.group(2)


def test_the_document_shows_the_matrix_the_tests_run():
    assert documented_block(DOC.read_text()) == matrix_markdown(), "run `python tests/test_reliability_matrix.py`"


if __name__ == "__main__":  # rewrite the matrix block of docs/reliability.md from the table
    documented_block(DOC.read_text())
    DOC.write_text(BLOCK.sub(lambda match: f"{match[1]}{matrix_markdown()}\n{match[3]}", DOC.read_text(), count=1))
    sys.exit(0)
