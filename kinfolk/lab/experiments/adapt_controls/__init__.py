"""adapt-controls (version 3 of the ADAPT question): ADAPT with a base corpus disjoint from the variants' data.

Modules, in the order a run uses them: `settings` (what the plan fixes), `runs` (one family's runs: students, sizes,
measurements, routing, kept as records) and `experiment` (endpoints, the validation-only choices and the analysis).
The base student's corpus is `kinfolk.lab.methods.adapt.base_corpus`'s (none of its rows a variant's post-training
prompt) and the selection rules are `kinfolk.lab.methods.selection`'s, both shared with other versions.

>>> from kinfolk.lab.experiments.adapt_controls import ControlsSettings
>>> ControlsSettings().runs
2
"""

from kinfolk.lab.experiments.adapt_controls.settings import METHODS, ControlsSettings

__all__ = ["METHODS", "ControlsSettings"]
