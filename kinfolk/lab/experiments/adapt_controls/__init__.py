"""adapt-controls (version 3 of the ADAPT question): ADAPT with a base corpus disjoint from the variants' data.

Modules, in the order a run uses them: `settings` (what the plan fixes), `base_corpus` (the base student's SFT rows,
none of them a variant's post-training prompt), `runs` (one family's runs: students, sizes, measurements, routing,
kept as records) and `experiment` (endpoints, the validation-only choices and the analysis). The selection rules
are `kinfolk.lab.methods.selection`'s, shared with version 2.

>>> from kinfolk.lab.experiments.adapt_controls import ControlsSettings
>>> ControlsSettings().runs
2
"""

from kinfolk.lab.experiments.adapt_controls.settings import METHODS, ControlsSettings

__all__ = ["METHODS", "ControlsSettings"]
