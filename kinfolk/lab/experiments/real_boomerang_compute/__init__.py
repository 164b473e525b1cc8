"""real-boomerang-compute (version 3 of the real-checkpoint ADAPT question): on SmolLM2-135M-Instruct, the distilled
student against cross-entropy-only students at equal training FLOPs and trained until validation stops improving.
Modules: `settings` (what the plan fixes), `runs` (one seed: its rows, students, ladder and curves) and `experiment`."""
