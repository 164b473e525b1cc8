"""adapt-controls (version 3 of the ADAPT question): ADAPT with a base corpus disjoint from the variants' data.

Modules, in the order a run uses them: `settings` (what the plan fixes), `base_corpus` (the base student's SFT rows,
none of them a variant's post-training prompt), `runs` (one family's runs: students, sizes, measurements, routing,
kept as records) and `experiment` (endpoints, the validation-only choices and the analysis). The selection rules
are `kinfolk.lab.adapt.selection`'s, shared with version 2.

>>> from kinfolk.lab.adapt.controls import ControlsSettings
>>> ControlsSettings().runs
2
"""

from kinfolk.lab.adapt.controls.settings import METHODS, ControlsSettings

__all__ = ["METHODS", "ControlsSettings"]
