"""Real checkpoints II: every size between a real student and its teacher, and whether distillation makes them
interpolate (the boomerang question, asked on SmolLM2-135M-Instruct under `docs/protocol.md`, units = seeds).

One idea per module: `settings` (the typed settings a plan fixes), `runs` (one seed: distil, measure both arms),
`experiment` (the `Experiment`: primaries, selection, analysis) and `figure` (every seed's curves). The text is
`kinfolk.lab.methods.real_corpus`'s; the patched sizes and their curve statistics are
`kinfolk.lab.methods.adapt.size_curves`'s, shared with version 2 (`real_boomerang_controls`). Nothing heavy is
imported here.
"""
