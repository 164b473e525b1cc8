"""Run a callback the moment a module finishes importing (at once if it already has).

`import kinfolk` must register kinfolk's PEFT tuner types, but PEFT pulls in transformers (seconds of start-up)
and many kinfolk commands never touch it (`kinfolk --version`, `kinfolk merge`). Registration therefore waits
for PEFT itself: anything that can load an adapter has imported `peft` first, and by then ATLAS is registered.

Installing the hook runs at every interpreter start (kinfolk's `.pth` startup line imports `kinfolk`), so this
module imports nothing at module level but `sys`: no `importlib.abc` (whose `importlib.resources` costs more
than the rest of kinfolk's start-up together), no `typing`.

>>> calls = []
>>> call_after_import("colorsys", lambda: calls.append("colorsys ready"))
>>> import colorsys
>>> calls
['colorsys ready']
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable


class _AfterImportFinder:
    """A `sys.meta_path` finder that finds nothing itself: it lets the other finders find `name`, then wraps the
    loader's `exec_module`.

    It stays on `sys.meta_path` until the module actually executes: a bare `importlib.util.find_spec(name)`
    (transformers probes for PEFT that way) must not use the hook up.
    """

    def __init__(self, name: str, callback: Callable[[], None]):
        self.name = name
        self.callback = callback
        self._asking_others = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._asking_others:
            return None
        import importlib.util  # only once `name` is being imported, never at start-up

        self._asking_others = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._asking_others = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original_exec = spec.loader.exec_module

        def exec_module(module):
            original_exec(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.callback()

        spec.loader.exec_module = exec_module
        return spec


def call_after_import(name: str, callback: Callable[[], None]) -> None:
    """Call `callback` once the top-level module `name` is imported: now if it is, else right after its import."""
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        callback()
        return
    if not any(isinstance(f, _AfterImportFinder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder(name, callback))
