"""`kinfolk.console.quiet`: a long verb's terminal gets its stage lines, one bar, kinfolk's own warnings once and its
result, none wider than 100 columns; the libraries' chatter (a Trainer's step dicts and bars, lm-eval's warnings,
transformers' logging, Python warnings, a subprocess's output) goes to the log file; `verbose` passes it through.
"""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import warnings

import pytest
from sft_helpers import weighted_data, weighted_trainer

from kinfolk import console
from kinfolk.console import WIDTH, quiet
from kinfolk.testing import build_tokenizer


def terminal_lines(*streams: io.StringIO) -> list[str]:
    return [line for stream in streams for line in stream.getvalue().splitlines()]


def test_library_chatter_goes_to_the_log_and_the_terminal_gets_the_stages(tmp_path, monkeypatch):
    monkeypatch.setattr(logging.getLogger("transformers"), "level", logging.WARNING)  # other tests' imports lower it
    out, err = io.StringIO(), io.StringIO()
    log = tmp_path / "run.log"
    with quiet(log, "kinfolk test", terminal=out, terminal_err=err):
        console.stage("scoring " + "a long stage description " * 12)  # wrapped, not cut
        print("{'loss': 1.25, 'grad_norm': 0.5}")
        print("from the C level", file=sys.stderr)
        subprocess.run([sys.executable, "-c", "import sys; print('child out'); print('child err', file=sys.stderr)"])
        logging.getLogger("transformers.modeling_utils").warning("some weights were not initialised")
        warnings.warn("a library's deprecation", FutureWarning, stacklevel=1)  # from this test file: not kinfolk's
        for _ in range(3):
            logging.getLogger("kinfolk.atomic").warning("removing a dead writer's staging")
        with console.bar(total=3, desc="work") as bar:
            bar.update(3)
        console.show("done: out/report.md")
    text = log.read_text()
    for chatter in ("'loss'", "from the C level", "child out", "child err", "not initialised", "deprecation"):
        assert chatter in text, chatter
    lines = terminal_lines(out, err)
    assert out.getvalue() == "done: out/report.md\n"
    stages = [line for line in lines if line.startswith("[kinfolk test ")]
    assert len(stages) == 1
    assert [line for line in lines if "warning:" in line] == ["warning: removing a dead writer's staging"]
    assert all(len(line.rsplit("\r", 1)[-1]) <= WIDTH for line in lines), lines
    joined = " ".join(line.strip() for line in err.getvalue().split("\n") if "\r" not in line)
    assert "a long stage description " * 3 in joined + " "  # the whole message, wrapped
    assert not any(chatter in err.getvalue() for chatter in ("'loss'", "child", "initialised", "deprecation"))
    assert sys.stdout is not None and sys.stderr is not None


def test_verbose_passes_everything_through(tmp_path, capfd):
    with quiet(tmp_path / "run.log", "kinfolk test", verbose=True):
        print("{'loss': 1.25}")
        console.stage("a stage")
    captured = capfd.readouterr()
    assert "'loss'" in captured.out and "a stage" in captured.err
    assert not (tmp_path / "run.log").exists()


@pytest.mark.slow
def test_a_trainer_and_lm_eval_under_the_console_leave_the_terminal_a_few_short_lines(tmp_path):
    from kinfolk.lab.world.family import LabConfig
    from kinfolk.lab.world.members import fresh_model
    from kinfolk.lab.world.tasks import evaluate_with_lm_eval
    from kinfolk.lab.world.tokenizer import build_lab_tokenizer

    out, err = io.StringIO(), io.StringIO()
    log = tmp_path / "run.log"
    with quiet(log, "kinfolk test", terminal=out, terminal_err=err):
        console.stage("training")
        trainer = weighted_trainer(build_tokenizer(), weighted_data(8), tmp_path / "run", max_steps=4, logging_steps=1)
        trainer.train()
        console.stage("lm-eval")
        lab_tokenizer = build_lab_tokenizer()
        model = fresh_model(LabConfig.quick_config().small_shape, lab_tokenizer, 0)
        evaluate_with_lm_eval(model, lab_tokenizer, skills=["add"], limit=4)
        console.show("headline")
    lines = terminal_lines(out, err)
    assert len(lines) == 3 and all(len(line) <= WIDTH for line in lines), lines
    text = log.read_text()
    assert text.count("'loss'") == 4  # the Trainer's step dicts, one per logged step
    # lm-eval's own records (its loggers are `lm_eval.*`), not just the "lm-eval" stage line
    assert re.search(r"^\S+ \S+ \w+ lm_eval\.\w", text, re.MULTILINE), text[-2000:]


def test_a_refused_run_leaves_no_log_and_an_earlier_log_is_kept(tmp_path):
    from kinfolk.errors import InputError

    fresh, earlier = tmp_path / "fresh.run.log", tmp_path / "earlier.run.log"
    earlier.write_text("the first run\n")
    for log in (fresh, earlier):
        with pytest.raises(InputError), quiet(log, "kinfolk test", terminal=io.StringIO()):
            print("loading")
            raise InputError("data.jsonl: row 3 has no 'completion'")
    assert not fresh.exists()
    assert earlier.read_text() == "the first run\nloading\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_on_a_terminal_and_not_into_a_file(tmp_path):
    """`make demo > log` once held lines of thousands of `\\r` redraws: a bar draws only where its stream is a tty."""
    for stream, drawn in ((io.StringIO(), False), (_Terminal(), True)):
        with (
            quiet(tmp_path / "run.log", "kinfolk test", terminal=io.StringIO(), terminal_err=stream),
            console.bar(total=3, desc="work") as bar,
        ):
            bar.update(3)
        assert ("work" in stream.getvalue()) is drawn
