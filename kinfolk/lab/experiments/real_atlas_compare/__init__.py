"""Real checkpoints IV (real-atlas version 2) on SmolLM2-135M-Instruct: ATLAS against LoRA, its norm-matched control
and LoRA + Output-KL, every run trained and measured by `kinfolk compare`'s code, units = seeds.

The design (settings, data, runs, verdicts and the experiment's stages) is `kinfolk.lab.methods.real_atlas_compare`,
shared with the second model's experiment (`real_atlas_compare_gemma`). Here: `experiment` (this model's
`Experiment`), `pilot` (the timed pilot seed that fixed its rates) and `notes` (its plan's notes). Nothing heavy is
imported here.
"""
