"""kinfolk as an axolotl plugin: `plugins: [kinfolk.integrations.axolotl.KinfolkPlugin]` (docs/axolotl.md).

The only package of kinfolk that imports axolotl; `kinfolk.integrations.axolotl.args` (the YAML's `kinfolk:` block)
does not, so the options can be checked without it.
"""

from kinfolk.integrations.axolotl.plugin import KinfolkPlugin

__all__ = ["KinfolkPlugin"]
