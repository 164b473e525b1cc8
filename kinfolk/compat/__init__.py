"""The library versions kinfolk is tested on, and one module per library where its behaviour differs inside them.

The tested window runs from the `oldest` to the `newest` cell of `cells.toml` beside this file, the same cells
`make test-compat` (tools/compat.py) builds its environments from, so the window has one home. Inside the window
kinfolk works the same on every version; where a library changed, its module here (`kinfolk.compat.trl`,
`kinfolk.compat.accelerate`) names the version it switches on and holds both sides.

A version outside the window (older than the oldest cell's, or of a minor release past the newest cell's) gets
one warning line on kinfolk's first use of its libraries, naming the package, its version and the window, from
the `kinfolk.compat` logger:

>>> window("trl")
Window(package='trl', oldest='1.14.1', newest='1.16.0')
>>> outside_window("trl", "1.16.3") is None, outside_window("trl", "1.14.1") is None
(True, True)
>>> print(outside_window("trl", "1.13.0"))
trl 1.13.0 is outside kinfolk's tested window (1.14.1 to 1.16.x); see docs/compatibility.md
>>> print(outside_window("torch", "2.15.0+cpu"))
torch 2.15.0+cpu is outside kinfolk's tested window (2.13.0 to 2.14.x); see docs/compatibility.md
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

CELLS = Path(__file__).with_name("cells.toml")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Window:
    """The oldest and newest tested release of one package."""

    package: str
    oldest: str
    newest: str


@functools.cache
def cells() -> dict[str, dict]:
    """The cells of `cells.toml`: name -> {"python": "3.12", "pins": {package: version}}."""
    return tomllib.loads(CELLS.read_text(encoding="utf-8"))["cells"]


def window(package: str) -> Window:
    """The tested window of `package`: its pins in the oldest and the newest cell."""
    return Window(package, cells()["oldest"]["pins"][package], cells()["newest"]["pins"][package])


def outside_window(package: str, version: str) -> str | None:
    """The warning line for `version` of `package` when it lies outside the window, else None. A patch release of
    the newest tested minor version counts as inside (libraries change private names in minor releases)."""
    tested = window(package)
    release = Version(version).release
    newest_minor = Version(tested.newest).release[:2]
    if release >= Version(tested.oldest).release and release[:2] <= newest_minor:
        return None
    return (
        f"{package} {version} is outside kinfolk's tested window ({tested.oldest} to "
        f"{'.'.join(map(str, newest_minor))}.x); see docs/compatibility.md"
    )


@functools.cache
def installed_version(package: str) -> str:
    return importlib.metadata.version(package)


@functools.cache
def warn_about_versions_outside_window() -> None:
    """Log one warning line for each installed package of the window whose version lies outside it (once per
    process: the compatibility modules call this when they are imported, i.e. on kinfolk's first use of its
    libraries)."""
    for package in cells()["oldest"]["pins"]:
        try:
            line = outside_window(package, installed_version(package))
        except importlib.metadata.PackageNotFoundError:
            continue
        if line is not None:
            logger.warning("kinfolk: warning: %s", line)


def at_least(package: str, version: str) -> bool:
    """Whether the installed `package` is `version` or newer (pre- and local releases count as their release)."""
    return Version(installed_version(package)).release >= Version(version).release
