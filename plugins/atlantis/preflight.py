"""Pre-flight checks of a scoring run: everything that can be known wrong before the first forward pass.

A scoring pass over a large dataset takes hours; a missing model, a formula's missing reference model, a broken
tokenizer or an unwritable output found at its end wastes them. `check_scoring_inputs` reads only configs,
tokenizers and safetensors headers. `score_dataset` calls it first; `kinfolk score` calls it with `out` before it
even loads the dataset.

>>> import tempfile
>>> from kinfolk.testing import TinyKit
>>> from kinfolk.plugins.atlantis import ScoreConfig
>>> family = TinyKit(tempfile.mkdtemp()).family("llama")
>>> try:
...     check_scoring_inputs({"large_base": family["large_base"]}, ScoreConfig(formula="ratio"))
... except ModelInputError as error:
...     print(error)
formula 'ratio' needs the small_base model; given: large_base
"""

from __future__ import annotations

from pathlib import Path

from transformers import PretrainedConfig

from kinfolk.atomic import check_destination, check_writable
from kinfolk.errors import ModelInputError
from kinfolk.inputs import check_model
from kinfolk.plugins.atlantis.cache import default_cache_dir
from kinfolk.plugins.atlantis.config import ROLES, ScoreConfig


def needed_roles(config: ScoreConfig) -> list[str]:
    """The model roles the formula (and IFD selection, if any) reads, in scoring order."""
    needed = set(config.roles) | ({config.ifd_model} if config.select_fraction is not None else set())
    return [role for role in ROLES if role in needed]


def check_scoring_inputs(
    models: dict[str, str | Path | None],
    config: ScoreConfig,
    out: str | Path | None = None,
    overwrite: bool = False,
) -> dict[str, PretrainedConfig]:
    """Refuse a scoring run that would fail after its expensive part; returns each given model's config.

    Checks: the formula's models (and the IFD model) are given; each given model has a loadable config, weights
    whose safetensors headers read, and a tokenizer; the score cache (when used) and `out` (when given) can be
    written, and `out` does not exist unless `overwrite`.
    """
    unknown = sorted(set(models) - set(ROLES))
    if unknown:
        raise ModelInputError(f"unknown model role(s) {unknown}; roles are {', '.join(ROLES)}")
    given = {role: path for role, path in models.items() if path is not None}
    missing = [role for role in needed_roles(config) if role not in given]
    if missing:
        ifd = f" and IFD selection by the {config.ifd_model} model" if config.select_fraction is not None else ""
        raise ModelInputError(
            f"formula {config.formula!r}{ifd} needs the {', '.join(missing)} model"
            + ("s" if len(missing) > 1 else "")
            + f"; given: {', '.join(given) or 'none'}"
        )
    configs = {role: check_model(path, role) for role, path in given.items()}
    if config.use_cache:
        check_writable(Path(config.cache_dir or default_cache_dir()) / "probe")
    if out is not None:
        check_destination(out, overwrite)
    return configs
