"""The command line answers at once and points at what was meant: a verb whose options are kinfolk's own imports no
torch to parse them (`--help`), and an unknown option or config key is refused in one line (exit 2) naming the
nearest known one, or the config file a merge key belongs in."""

import subprocess
import sys

import pytest
from refusal_helpers import assert_command_refused

# the verbs whose options are kinfolk's own: their modules must load without the training stack
LIGHT_VERBS = ("score", "merge", "route", "churn", "drift", "lab", "demo", "env")
HEAVY = ("torch", "transformers", "datasets", "peft", "trl.trainer", "lm_eval")


def test_light_verb_modules_import_without_the_training_stack():
    imports = "; ".join(f"import kinfolk.commands.{verb}" for verb in LIGHT_VERBS)
    code = f"import sys; {imports}; print(sorted(name for name in {HEAVY!r} if name in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_light_verbs_print_help_without_the_training_stack():
    # what `--help` runs past the import: building each verb's parser (merge: with an operation's config keys)
    code = (
        "import contextlib, io, sys\n"
        "from kinfolk.commands import main\n"
        f"for argv in {[[verb, '--help'] for verb in LIGHT_VERBS] + [['merge', 'patch', '--help']]!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as shown:\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    assert shown.getvalue().startswith('usage: kinfolk'), argv\n"
        f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["score", "--data", "d.jsonl", "--out", "o.jsonl", "--formla", "ratio"], "--formla: unknown option; did "
         "you mean --formula?"),
        (["merge", "patch", "patch.yaml", "--dry-rn"], "--dry-rn: unknown option; did you mean --dry-run?"),
        (["route", "--outcoms", "o.jsonl", "--out", "r"], "--outcoms: unknown option; did you mean --outcomes?"),
        (["churn", "a.jsonl", "b.jsonl", "--bootstrp", "5"], "--bootstrp: unknown option; did you mean --bootstrap?"),
        (["drift", "--requirments", "1:2"], "--requirments: unknown option; did you mean --requirements?"),
        (["lab", "build", "--quik"], "--quik: unknown option; did you mean --quick?"),
        (["demo", "--quik"], "--quik: unknown option; did you mean --quick?"),
        (["env", "--jsn"], "--jsn: unknown option; did you mean --json?"),
        (["distil", "--teacher", "t", "--out", "o", "--sft_dta", "d.jsonl"], "--sft_dta: unknown option, neither "
         "kinfolk distil's nor accelerate launch's; did you mean --sft_data?"),
        (["eval", "--model", "hf", "--taks", "x"], "--taks: unknown option; did you mean --tasks?"),
        (["score", "--data", "d.jsonl", "--out", "o.jsonl", "--bogus", "1"], "--bogus: unknown option (see --help)"),
    ],
)  # fmt: skip
def test_an_unknown_option_names_the_nearest_known_one(argv, said, tmp_path):
    line = assert_command_refused(argv, said, destination=tmp_path / "nothing")
    assert f": error: {said}" in line  # the hint starts the message, right after the verb's prefix


def test_sft_suggests_the_option_a_typo_meant(tmp_path):
    argv = ["sft", "--model_name_or_path", "m", "--output_dir", tmp_path / "run", "--learnng_rate", "1e-4"]
    said = (
        "--learnng_rate: unknown option, neither kinfolk sft's nor accelerate launch's; did you mean --learning_rate?"
    )
    assert_command_refused(argv, said, destination=tmp_path / "run")


def test_an_unknown_config_key_names_the_nearest_known_one(tmp_path):
    config = tmp_path / "score.yaml"
    config.write_text("formla: ratio\n")
    argv = ["score", "--config", config, "--data", "d.jsonl", "--out", tmp_path / "o.jsonl"]
    assert_command_refused(argv, f"{config}: unknown key(s) 'formla'; did you mean 'formula'?")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["merge", "patch", "patch.yaml", "--teacher", "t"],
         "--teacher: 'teacher' is a key of the patch config file (CONFIG.yaml), not an option; set it there"),
        (["merge", "init-student", "init.yaml", "--layers", "{every: 2}"],
         "--layers: 'layers' is a key of the init-student config file (CONFIG.yaml), not an option; set it there"),
        (["merge", "patch", "patch.yaml", "--num-patchd", "2"],
         "--num-patchd: unknown option; did you mean 'num_patched', a key of the patch config file (CONFIG.yaml)?"),
    ],
)  # fmt: skip
def test_a_merge_config_key_given_as_an_option_is_pointed_to_the_config_file(argv, said, tmp_path):
    (tmp_path / "patch.yaml").write_text("teacher: t\nstudent: s\n")
    assert_command_refused(argv, said, destination=tmp_path / "nothing")
