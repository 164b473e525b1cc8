"""atlantis-controls (version 3 of the ATLANTIS question): the arms that could explain ATLANTIS's gain away.

Modules, in the order data flows: `settings` (what the plan fixes), `arms` (each arm's training rows), `runs` (one
family's run, kept as a record), `experiment` (selection and endpoints), `extension` (the exploratory extension of
uniform's learning-rate grid) and `__main__` (the runs, shared between processes).
"""
