"""Work kept on disk so a stopped run resumes where it was: `cached_json` keeps a computation's JSON result at a
path, and `settings_key` names a record by the settings that made it (a changed setting makes a new record).

>>> import tempfile
>>> from pathlib import Path
>>> path = Path(tempfile.mkdtemp()) / "work" / "result.json"
>>> cached_json(path, lambda: {"score": 0.5}), cached_json(path, lambda: {"score": 0.9})  # the second is read back
({'score': 0.5}, {'score': 0.5})
>>> settings_key({"steps": 2}) == settings_key({"steps": 2}) != settings_key({"steps": 3})
True
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kinfolk.atomic import write_json


def settings_key(settings: dict[str, Any]) -> str:
    """A short hash of an experiment's settings: a kept record is reused only under the same settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_json(path: Path, compute: Callable[[], Any]) -> Any:
    """`compute()`'s JSON result, kept at `path` (atomically) so a stopped run resumes where it was."""
    if path.exists():
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, value)
    return value
