"""adapt-frontier (version 4 of the ADAPT question): routing against every random mix of fixed sizes, sizes that
differ in depth, a student trained without distillation and the base student taught the other variant's format.

Modules, in the order a run uses them: `settings` (what the plan fixes), `runs` (one family's runs: students, sizes,
measurements, routing, kept as records) and `experiment` (endpoints, the validation-only choices and the analysis).
The base student's corpus is `kinfolk.lab.methods.adapt.base_corpus`'s and the selection rules and the random-mix
frontier are `kinfolk.lab.methods.selection`'s.

>>> from kinfolk.lab.experiments.adapt_frontier import FrontierSettings
>>> FrontierSettings().teacher_layers, FrontierSettings().layers
(12, '{every: 3}')
"""

from kinfolk.lab.experiments.adapt_frontier.settings import METHODS, FrontierSettings

__all__ = ["METHODS", "FrontierSettings"]
