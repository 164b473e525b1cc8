"""kinfolk as an axolotl plugin: `plugins: [kinfolk.integrations.axolotl.KinfolkPlugin]` (docs/axolotl.md).

The only package of kinfolk that imports axolotl, and only when `KinfolkPlugin` is first asked for
(`kinfolk.lazy`): `kinfolk.integrations.axolotl.args`, the YAML's `kinfolk:` block, loads without axolotl.
"""

from kinfolk.lazy import lazy_exports

_EXPORTS = {"kinfolk.integrations.axolotl.plugin": ("KinfolkPlugin",)}
__all__ = ["KinfolkPlugin"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
