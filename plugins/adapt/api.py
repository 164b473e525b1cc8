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

from kinfolk.plugins.adapt.config import CONFIGS, MergeConfigError, load_config
from kinfolk.plugins.adapt.execute import execute
from kinfolk.plugins.adapt.layer_map import LayerMap  # noqa: F401  (used by the doctest)
from kinfolk.plugins.adapt.plan import build_plan


def merge(
    config: Any, out: str | Path, overwrite: bool = False, all_sizes: bool = False, progress: bool = True
) -> Path:
    """Run one merge. `config` is a typed config or a mapping with an `op` key; returns the output path."""
    if isinstance(config, dict):
        if config.get("op") not in CONFIGS:
            raise MergeConfigError(
                f"a merge config needs an 'op' key, one of {', '.join(CONFIGS)}; got {config.get('op')!r}"
            )
        config = load_config(config["op"], config)
    return execute(build_plan(config, all_sizes), out, overwrite, progress)
