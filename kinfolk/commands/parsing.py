"""`VerbParser`: TRL's dataclass parser with the command line's conventions.

`TrlParser` (itself transformers' `HfArgumentParser`) turns dataclass fields into options, each `--x_y` also
accepted as `--x-y`, and reads `--config FILE.yaml` as defaults. On top of it a verb's parser reports a usage error as
one line (exit 2) — as it does a `--config` file that is not a YAML mapping and a value a dataclass's own checks
refuse — and refuses options and config keys it does not know instead of ignoring them, abbreviations included,
naming the nearest known one (`did_you_mean`). `--help` shows each default as a user would type it
(`--thresholds 0.2 0.5`, not `[np.float64(0.2), np.float64(0.5)]`, `typed_default`). `file_keys` names keys that belong in a file the verb reads, not on
its command line (`kinfolk merge`'s CONFIG.yaml): such a key given as an option is pointed there.

>>> from dataclasses import dataclass, field
>>> @dataclass
... class Options:
...     cache_dir: str = field(default="cache", metadata={"help": "where scores are cached"})
>>> VerbParser(Options, prog="kinfolk demo").parse(["--cache-dir", "elsewhere"])[0].cache_dir
'elsewhere'
>>> VerbParser(Options, prog="kinfolk demo").unknown_option("--cach_dir")
'--cach_dir: unknown option; did you mean --cache_dir?'
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn

import yaml
from trl import TrlParser

from kinfolk.errors import did_you_mean, nearest


def config_file(argv: Sequence[str]) -> str:
    """The `--config` file named in `argv` (for messages about its keys)."""
    argv = list(argv)
    return argv[argv.index("--config") + 1] if "--config" in argv[:-1] else "the --config file"


def first_option(tokens: Sequence[str]) -> str | None:
    """The first token that is an option (`--name`, `--name=value`, `-x`), without its value; None if none is."""
    for token in tokens:
        if token.startswith("-") and not _is_number(token):
            return token.split("=", 1)[0]
    return None


UNRECOGNIZED = "unrecognized arguments: "  # how argparse starts the message


def reworded(message: str, known: Iterable[str]) -> str:
    """An argparse error message on one line, `unrecognized arguments: ...` said as `VerbParser` says it: the first
    unknown option, and the nearest `known` one (for parsers kinfolk wraps, e.g. lm-eval's).

    >>> reworded("unrecognized arguments: --taks x", ["--tasks", "--model"])
    '--taks: unknown option; did you mean --tasks?'
    """
    message = " ".join(message.split())
    option = first_option(message.removeprefix(UNRECOGNIZED).split()) if message.startswith(UNRECOGNIZED) else None
    return f"{option}: unknown option{did_you_mean(option, known)}" if option else message


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def typed_default(value: object) -> object:
    """A default as a user would type it on the command line: a list as its values separated by spaces, a numpy
    scalar as the plain number.

    >>> import numpy as np
    >>> typed_default([np.float64(0.25), np.float64(1.0)]), typed_default(np.int64(3)), typed_default("cache")
    ('0.25 1.0', 3, 'cache')
    """
    if isinstance(value, list | tuple):
        return " ".join(str(typed_default(item)) for item in value)
    item = getattr(value, "item", None)  # numpy scalars (and 0-d arrays) hold a plain Python value
    return item() if callable(item) and getattr(value, "shape", None) == () else value


class TypedDefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with every `(default: ...)` shown by `typed_default`."""

    def _expand_help(self, action: argparse.Action) -> str:
        shown = copy.copy(action)
        shown.default = typed_default(action.default)
        return super()._expand_help(shown)


class VerbParser(TrlParser):
    def __init__(self, dataclass_types=None, file_keys: Mapping[str, str] | None = None, **kwargs):
        # argparse would take `--temperature` for `--temperatures`: a typo must be refused, not guessed
        kwargs = {"allow_abbrev": False, "formatter_class": TypedDefaultsHelpFormatter, **kwargs}
        super().__init__(dataclass_types, **kwargs)
        self.file_keys = dict(file_keys or {})  # key -> the file it belongs in, e.g. "the patch CONFIG.yaml"

    def option_names(self) -> list[str]:
        """Every option string this parser knows (both spellings)."""
        return list(self._option_string_actions)

    def unknown_option(self, name: str) -> str:
        """What to say of an option this parser does not know: a key of a file the verb reads (`file_keys`), or
        the nearest option (or file key) it may have been meant as."""
        key = name.lstrip("-").replace("-", "_")
        if key in self.file_keys:
            return f"{name}: {key!r} is a key of {self.file_keys[key]}, not an option; set it there"
        option = nearest(name, self.option_names())
        if option is not None:
            return f"{name}: unknown option; did you mean {option}?"
        file_key = nearest(key, self.file_keys)
        if file_key is not None:
            return f"{name}: unknown option; did you mean {file_key!r}, a key of {self.file_keys[file_key]}?"
        return f"{name}: unknown option"

    def refuse_arguments(self, rest: Sequence[str]) -> NoReturn:
        """Refuse the arguments no option took: the first unknown option, with a suggestion, or the stray values."""
        option = first_option(rest)
        self.error(self.unknown_option(option) if option else f"unrecognized arguments: {' '.join(rest)}")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")

    _strict = False  # set while `parse_with_rest(strict=True)` runs

    def parse_known_args(self, args=None, namespace=None):
        if not self._strict or {"-h", "--help"} & set(args or []):  # help shows the required options as such
            namespace, rest = super().parse_known_args(args, namespace)
            self._unknown_options = rest  # seen before the dataclasses are built (and their checks run)
            return namespace, rest
        # strict: an unknown option is named before the required ones it may have been meant as
        required = [action for action in self._actions if action.required]
        for action in required:
            action.required = False
        try:
            namespace, rest = super().parse_known_args(args, namespace)
        finally:
            for action in required:
                action.required = True
        if rest:
            self.refuse_arguments(rest)
        missing = [argparse._get_action_name(action) for action in required if getattr(namespace, action.dest) is None]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        self._unknown_options = rest
        return namespace, rest

    def set_defaults_with_config(self, **kwargs) -> list[str]:
        self._unknown_keys = super().set_defaults_with_config(**kwargs)
        return self._unknown_keys

    def parse_with_rest(self, argv: Sequence[str] | None, strict: bool = False) -> tuple[tuple, list[str], list[str]]:
        """The dataclasses (then a namespace of any plain `add_argument` arguments, e.g. positionals), the config
        keys and the command-line arguments that no dataclass knows. `strict` refuses those unknown ones, before
        any check of the dataclasses does: a typo is named, not the option it left unset."""
        argv = list(argv or [])
        self._unknown_options, self._unknown_keys, self._strict = [], [], strict
        try:
            *parsed, config_rest, cli_rest = self.parse_args_and_config(
                list(argv), return_remaining_strings=True, separate_remaining_strings=True
            )
        except (ValueError, yaml.YAMLError) as error:  # a bad --config file or a value a config's checks refuse
            if strict:
                self._refuse_unknown(argv, self._unknown_keys, self._unknown_options)
            self.error(str(error))
        finally:
            self._strict = False
        if strict:
            self._refuse_unknown(argv, config_rest, cli_rest)
        return tuple(parsed), config_rest, cli_rest

    def _refuse_unknown(self, argv: list[str], config_rest: list[str], cli_rest: list[str]) -> None:
        if cli_rest:
            self.refuse_arguments(cli_rest)
        if config_rest:
            keys = [flag.lstrip("-") for flag in config_rest[::2]]
            known = [action.dest for action in self._actions if action.option_strings]
            hint = did_you_mean(keys[0], known, quote=True) if len(keys) == 1 else ""
            self.error(f"{config_file(argv)}: unknown key(s) {', '.join(map(repr, keys))}{hint}")

    def parse(self, argv: Sequence[str] | None) -> tuple:
        """What `parse_with_rest` parses, refusing unknown options and config keys."""
        return self.parse_with_rest(argv, strict=True)[0]

    def parse_known(self, argv: Sequence[str]) -> tuple[tuple, list[str]]:
        """The dataclasses, and the arguments this parser does not know (for a program it wraps), in order."""
        *parsed, rest = self.parse_args_into_dataclasses(list(argv), return_remaining_strings=True)
        return tuple(parsed), rest
