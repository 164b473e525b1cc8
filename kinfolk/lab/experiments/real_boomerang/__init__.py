"""Real checkpoints II: every size between a real student and its teacher, and whether distillation makes them
interpolate (the boomerang question, asked on SmolLM2-135M-Instruct under `docs/protocol.md`, units = seeds).

One idea per module: `settings` (the typed settings a plan fixes), `corpus` (the offline text sources and their
fixed train / held-out split), `sizes` (every patched size of a student, built in memory from `kinfolk merge
patch --all`'s plan, and its measurement against the teacher), `runs` (one seed: distil, measure both arms),
`experiment` (the `Experiment`: primaries, selection, analysis; the curve statistics are the ADAPT lab's),
`figure` (every seed's curves) and `__main__` (seeds in parallel processes). Nothing heavy is imported here.
"""
