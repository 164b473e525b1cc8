"""A package's public names, imported from their submodules on first use (PEP 562's module `__getattr__`).

`from kinfolk.plugins.atlantis.config import ScoreConfig` runs `plugins/atlantis/__init__.py` first; when
that imported the scoring pipeline (torch, transformers, datasets), a command had to import them all to print its
options (`kinfolk score --help`: seconds). A package built with `lazy_exports` keeps its names (`from kinfolk.trainers
import WeightedSFTTrainer`, `__all__`, `dir()`) while importing a submodule only when one of its names is asked for.

>>> import sys, types
>>> package = types.ModuleType("demo_package")
>>> sys.modules["demo_package"] = package
>>> package.__getattr__, package.__dir__ = lazy_exports("demo_package", {"colorsys": ("rgb_to_hsv",)})
>>> "colorsys" in sys.modules and "rgb_to_hsv" in vars(package)
False
>>> from demo_package import rgb_to_hsv
>>> rgb_to_hsv(1.0, 0.0, 0.0)
(0.0, 1.0, 1.0)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose names are `exports` ({absolute module: its names}).

    tests/test_layering.py reads the modules of this mapping as imports of the package (layers and circles)."""
    owner = {name: module for module, names in exports.items() for name in names}
    # importing submodule `package.x` sets the package's attribute `x` to it, over an exported `x`
    shadowed = sorted(set(owner) & {module.rpartition(".")[2] for module in exports})
    if shadowed:
        raise ValueError(f"{package} exports {', '.join(shadowed)}, the name of its own submodule")

    def __getattr__(name: str) -> object:
        if name not in owner:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(owner[name]), name)
        setattr(sys.modules[package], name, value)  # found directly from now on
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *owner})

    return __getattr__, __dir__
