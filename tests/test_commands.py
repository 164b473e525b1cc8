"""The command line's conventions, the same for every verb: dataclass options in both spellings, exit 0 / 1 / 2,
one line for bad input (a traceback only with --debug or KINFOLK_DEBUG=1)."""

import importlib
import sys

import pytest

from kinfolk.commands import VERBS, main
from kinfolk.commands.merge import make_parser as merge_parser
from kinfolk.commands.score import ScoreArguments
from kinfolk.errors import InputError, MissingInputError
from kinfolk.plugins.atlantis.config import ScoreConfig


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_is_a_module_with_main(verb):
    assert callable(importlib.import_module(VERBS[verb][0]).main)


def test_both_spellings_of_every_option():
    for flags in (["--dry-run", "--no-progress"], ["--dry_run", "--no_progress"]):
        args, positional = merge_parser().parse(["patch", "patch.yaml", *flags])
        assert args.dry_run and args.no_progress and positional.op == "patch"
    from kinfolk.commands.parsing import VerbParser

    parser = VerbParser((ScoreArguments, ScoreConfig), prog="kinfolk score")
    for flag in ("--cache-dir", "--cache_dir"):
        _, config = parser.parse(["--data", "d.jsonl", "--out", "o", flag, "scores"])
        assert config.cache_dir == "scores"


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["score", "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.jsonl: no such data file" in err and "Traceback" not in err


def test_usage_errors_are_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["score", "--data", "d.jsonl", "--out", "o", "--no_such_option", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no_such_option: unknown option" in err


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    argv = ["score", "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o.jsonl")]
    with pytest.raises(MissingInputError):
        main(["--debug", *argv])
    monkeypatch.setenv("KINFOLK_DEBUG", "1")
    with pytest.raises(InputError):
        main(argv)


def test_runtime_failures_keep_their_traceback(monkeypatch):
    # not bad input: the exception propagates, so the process ends with Python's traceback and exit code 1
    def broken(argv):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(sys.modules["kinfolk.commands.merge"], "main", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        main(["merge", "patch", "x.yaml"])


def test_eval_help_documents_kinfolks_own_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert "--skip_default_tasks" in shown and "--skip-default-tasks" in shown and "lm-eval run --help" in shown


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        # options a dataclass check would otherwise pre-empt ("--outcomes and --out are required")
        (["route", "--bogus", "1"], "kinfolk route: error: --bogus: unknown option"),
        # an option neither distil nor accelerate launch knows, refused before "--teacher and --out are required"
        (["distil", "--bogus", "1"], "kinfolk distil: error: --bogus: unknown option, neither kinfolk distil's nor"),
        # lm-eval's parser, speaking as kinfolk eval
        (["eval", "--bogus", "1"], "kinfolk eval: error: --bogus: unknown option (see kinfolk eval --help"),
    ],
)
def test_an_unknown_option_is_named_as_the_verbs_own(argv, named, capsys):
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip().splitlines()[-1]] and err.startswith(named), err


@pytest.mark.parametrize("argv", [["lab", "--help"], ["lab", "experiment", "--help"]])
def test_lab_help_starts_with_a_usage_line(argv, capsys):
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"usage: kinfolk {' '.join(argv[:-1])} {{")


def test_merge_op_help_lists_that_operations_config_keys(capsys):
    from kinfolk.plugins.adapt.config import PatchConfig

    with pytest.raises(SystemExit) as exit_info:
        main(["merge", "patch", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert "patch: Model = the student with some layers replaced" in shown and "CONFIG.yaml keys:" in shown
    for key in ("teacher", "student", "order", "num_patched", "patched_layers", "allow_other_teacher"):
        assert f"  {key}: {PatchConfig.__dataclass_fields__[key].metadata['help'][:40]}" in shown
    assert "teacher: teacher model directory (required)" in shown


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            ["score", "--dat", "x.jsonl", "--out", "o"],
            "kinfolk score: error: --dat: unknown option; did you mean --data?",
        ),
        (["drift", "--bogus", "1"], "kinfolk drift: error: --bogus: unknown option"),
        (["drift", "--method", "a"], "kinfolk drift: error: the following arguments are required: --target, --out"),
        (["churn", "a.jsonl"], "kinfolk churn: error: the following arguments are required: adapted"),
    ],
)
def test_a_typo_is_named_before_the_required_option_it_leaves_unset(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(named)
