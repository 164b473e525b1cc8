"""Real checkpoints II, version 2: every size between SmolLM2-135M-Instruct and a 16-layer student, for a
distilled student, the same student trained on the same rows with cross-entropy only, and the untrained
(layer-dropped) student, each seed measured on its own draw of held-out rows (`docs/protocol.md`, units = seeds).

One idea per module: `settings` (the typed settings the plan fixes), `runs` (one seed: its rows, its two trained
students, the three arms' curves), `experiment` (the `Experiment`: primaries, analysis) and `figure` (every seed's
curves). Nothing heavy is imported here.
"""
