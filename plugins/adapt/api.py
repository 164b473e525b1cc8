"""One call per merge, for Python users: `merge(config, out)` plans, checks and writes.

>>> import tempfile, pathlib
>>> from kinfolk.testing import TinyKit
>>> kit = TinyKit(tempfile.mkdtemp())
>>> out = pathlib.Path(tempfile.mkdtemp()) / "student"
>>> _ = merge({"op": "init-student", "teacher": str(kit.model_dir("qwen3", "large")), "layers": {"every": 2}},
...           out, progress=False)
>>> LayerMap.load(out).blocks
((0, 2), (2, 4))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kinfolk.plugins.adapt.config import DeltaCosineConfig, MergeConfigError, load_config
from kinfolk.plugins.adapt.cosine import write_delta_cosine
from kinfolk.plugins.adapt.execute import execute
from kinfolk.plugins.adapt.layer_map import LayerMap  # noqa: F401  (used by the doctest)
from kinfolk.plugins.adapt.plan import build_plan


def merge(
    config: Any, out: str | Path, overwrite: bool = False, all_sizes: bool = False, progress: bool = True
) -> Path | dict[str, Any]:
    """Run one merge. `config` is a typed config or a mapping with an `op` key; returns the output path
    (or, for delta-cosine, the cosines, which are also written to `out` as JSON)."""
    if isinstance(config, dict):
        if "op" not in config:
            raise MergeConfigError("a config mapping needs an 'op' key (init-student, delta, patch, ...)")
        config = load_config(config["op"], config)
    if isinstance(config, DeltaCosineConfig):
        return write_delta_cosine(config, out, overwrite, progress)
    return execute(build_plan(config, all_sizes), out, overwrite, progress)
