"""Real checkpoints IV (real-atlas version 2): ATLAS against LoRA, its norm-matched control and LoRA + Output-KL on
SmolLM2-135M-Instruct, every run trained and measured by `kinfolk compare`'s code, units = seeds.

Modules: `settings` (what the plan fixes), `data` (each seed's data folders, drawn from the pools), `runs` (one
seed's arms through compare's plan and grid, Output-KL's strength chosen and its grid extended, the seed's record
kept), `verdicts` (a seed's verdicts by compare's analysis), `pilot` (the timed pilot seed), `notes` (the plan's
notes) and `experiment` (the `Experiment`). Nothing heavy is imported here.
"""
