"""The fields every experiment's settings share, in the base dataclasses they extend.

A plan holds `dataclasses.asdict(settings)` and its hash is that of the committed file, so a settings class keeps
its fields' names, values and order: a base's fields come first in the order, which is why only the fields that
open every plan's settings live here. The two kinds of unit open differently:

- `FamilySettings`: units are lab families (`families`), each with `runs` runs (the controls experiments; each
  also declares, last, its `work` folder, its `records` folder and `family_overrides`);
- `RealModelSettings`: a real checkpoint (`model`, resolved by `model_dir`), units are seeds (declared after the
  experiment's own fields, with the `work` and `records` folders).

>>> FamilySettings().families, FamilySettings().runs
([0, 1, 2, 3, 4], 2)
>>> RealModelSettings(model="/tmp").model_dir()
PosixPath('/tmp')
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REAL_MODELS_ENV = "KINFOLK_REAL_MODELS"  # where `make real-models` puts the converted checkpoints


def real_models_root() -> Path:
    """Where `make real-models` puts the converted checkpoints and retained texts: `$KINFOLK_REAL_MODELS`, else
    `$XDG_CACHE_HOME/kinfolk/real-models` (XDG's default `~/.cache`), the rule `tools/real_models.py` writes by, so
    the lab looks where the tool wrote whatever the user's cache home is."""
    if os.environ.get(REAL_MODELS_ENV):
        return Path(os.environ[REAL_MODELS_ENV]).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home).expanduser() / "kinfolk" / "real-models"


@dataclass(frozen=True)
class FamilySettings:
    families: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4], metadata={"help": "Family seeds (units)."})
    runs: int = field(
        default=2, metadata={"help": "Runs per family, each with its own seeds (what each draws: the experiment's)."}
    )


@dataclass(frozen=True)
class RealModelSettings:
    model: str = field(
        default="smollm2-135m-instruct",
        metadata={"help": "a model directory, or a name under $KINFOLK_REAL_MODELS (make real-models)"},
    )

    def model_dir(self) -> Path:
        if Path(self.model).is_dir():
            return Path(self.model)
        return real_models_root() / self.model
