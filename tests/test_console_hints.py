"""Every hint kinfolk's console prints is accepted by the command that prints it: each option a message tells the user
to pass (`kinfolk.hints.HINTS`, registered by the modules that build the messages) is an option of every verb that
prints it, and the hints that are whole command lines parse with that verb's parser."""

import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from kinfolk.commands import main
from kinfolk.commands.parsing import VerbParser
from kinfolk.hints import HINTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"kinfolk": "kinfolk", "plugins": "kinfolk.plugins", "trainers": "kinfolk.trainers",
            "callbacks": "kinfolk.callbacks"}  # fmt: skip


def modules_with_hints() -> list[str]:
    """Every module whose source registers a hint (`suggest(` outside kinfolk.hints itself)."""
    found = []
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "hints.py" and "suggest(" in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT / folder).with_suffix("").parts
                found.append(".".join((package, *parts)).removesuffix(".__init__"))
    return found


def help_text(verb: str) -> str:
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        main([*verb.split(), "--help"])
    return shown.getvalue()


def test_every_hint_names_options_of_each_verb_that_prints_it():
    modules = modules_with_hints()
    assert {"kinfolk.commands.route", "kinfolk.trainers.config_defaults", "kinfolk.compare.analysis"} <= set(modules)
    for module in modules:
        importlib.import_module(module)
    assert "--bf16 true" in HINTS and HINTS["--bf16 true"] == {"sft", "distil"}  # not compare, which has no --bf16
    helps: dict[str, str] = {}
    for hint, verbs in sorted(HINTS.items()):
        for verb in sorted(verbs):
            known = helps.setdefault(verb, help_text(verb))
            for option in (token for token in shlex.split(hint) if token.startswith("--")):
                assert re.search(rf"{re.escape(option)}\b", known), f"{verb} prints {hint!r} but has no {option}"


def test_the_bf16_hint_parses_with_the_verbs_that_print_it():
    from kinfolk.commands.distil import make_parser

    (_, training), _, rest = make_parser().parse_with_rest(
        ["--teacher", "t", "--out", "o", "--sft_data", "d.jsonl", "--use_cpu", *shlex.split("--bf16 true")]
    )
    assert training.bf16 is True and rest == []


def test_the_route_hint_is_a_command_route_parses():
    from kinfolk.commands.route import RouteArguments, score_hint

    argv = ["--outcomes", "o u.jsonl", "--out", "routing/", "--cost", "flops"]
    hint = score_hint({"score": "correct", "carries_loss": True}, argv)
    command = shlex.split(hint.split("to route on it: ", 1)[1])
    assert command[:2] == ["kinfolk", "route"]
    (args,) = VerbParser(RouteArguments, prog="kinfolk route").parse(command[2:])
    assert (args.outcomes, args.cost, args.score) == ("o u.jsonl", "flops", "loss")
    assert score_hint({"score": "loss", "carries_loss": True}, argv) is None
