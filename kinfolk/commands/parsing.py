"""`VerbParser`: TRL's dataclass parser with the command line's conventions.

`TrlParser` (itself transformers' `HfArgumentParser`) turns dataclass fields into options, each `--x_y` also
accepted as `--x-y`, and reads `--config FILE.yaml` as defaults. On top of it a verb's parser reports a usage error as
one line (exit 2) — as it does a `--config` file that is not a YAML mapping and a value a dataclass's own checks
refuse — and refuses options and config keys it does not know instead of ignoring them.

>>> from dataclasses import dataclass, field
>>> @dataclass
... class Options:
...     cache_dir: str = field(default="cache", metadata={"help": "where scores are cached"})
>>> VerbParser(Options, prog="kinfolk demo").parse(["--cache-dir", "elsewhere"])[0].cache_dir
'elsewhere'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import yaml
from trl import TrlParser


class VerbParser(TrlParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")

    def parse_with_rest(self, argv: Sequence[str] | None) -> tuple[tuple, list[str], list[str]]:
        """The dataclasses (then a namespace of any plain `add_argument` arguments, e.g. positionals), the config
        keys and the command-line arguments that no dataclass knows."""
        try:
            *parsed, config_rest, cli_rest = self.parse_args_and_config(
                list(argv or []), return_remaining_strings=True, separate_remaining_strings=True
            )
        except (ValueError, yaml.YAMLError) as error:  # a bad --config file or a value a config's checks refuse
            self.error(str(error))
        return tuple(parsed), config_rest, cli_rest

    def parse(self, argv: Sequence[str] | None) -> tuple:
        """What `parse_with_rest` parses, refusing unknown options and config keys."""
        parsed, config_rest, cli_rest = self.parse_with_rest(argv)
        unknown = cli_rest + config_rest[::2]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed

    def parse_known(self, argv: Sequence[str]) -> tuple[tuple, list[str]]:
        """The dataclasses, and the arguments this parser does not know (for a program it wraps), in order."""
        *parsed, rest = self.parse_args_into_dataclasses(list(argv), return_remaining_strings=True)
        return tuple(parsed), rest
