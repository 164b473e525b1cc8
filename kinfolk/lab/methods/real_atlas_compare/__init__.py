"""real-atlas version 2's design, shared by the experiments of each model (`real-atlas-compare` on SmolLM2,
`real-atlas-compare-gemma` on Gemma-3-270m): `settings` (what a plan fixes), `data` (each seed's data folders, drawn
from the pools), `runs` (one seed's arms through compare's plan and grid, Output-KL's strength chosen and its grid
extended, the seed's record kept), `verdicts` (a seed's verdicts by compare's analysis) and `design` (the
`Experiment` stages both models share). Nothing heavy is imported here.
"""
