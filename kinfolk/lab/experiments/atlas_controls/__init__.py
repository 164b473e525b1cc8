"""atlas-controls (version 3 of the ATLAS question): the arms that could explain ATLAS's lower drift away.

Modules, in the order data flows: `settings` (methods, grids, sources; what the plan fixes), `sources` (the retained
rows drift is measured on, none of them the atlas's fitting data, and the measurement of one checkpoint), `runs`
(one family's runs per adapter seed, kept and shared between processes), `experiment` (selection on validation
and the endpoints).
"""
