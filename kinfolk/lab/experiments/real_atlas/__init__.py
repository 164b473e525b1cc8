"""Real checkpoints I: does an ATLAS adapter move a real model's retained answers less than LoRA at the same gain?
Asked on SmolLM2-135M-Instruct under `docs/protocol.md`, units = seeds.

One idea per module: `settings` (the typed settings a plan fixes), `corpus` (the offline text and its per-seed
splits: code to learn, three retained sources), `runs` (one seed: the frozen reference, the atlas, one run per
method measured at every checkpoint, the chosen adapters kept), `pilot` (the pilot seed that chose the learning rates before the plan), `experiment` (the `Experiment`: primaries,
selection by `kinfolk.lab.methods.selection`'s rules, analysis), `figure` (every seed's drift-against-gain curves) and `__main__` (runs in parallel processes). Nothing heavy is imported here.
"""
