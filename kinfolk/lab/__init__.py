"""The lab: a tiny model family trained on the CPU with kinfolk's own trainers, with ground truth by construction.

One idea per module: `tokenizer` (characters), `skills` (problems, formats, p* and p_d), `corpus` (datasets),
`training` (the lab's `WeightedSFTTrainer` recipe), `family` (`build_family`, cached by config hash), `evaluate`
(greedy skill scores), `tasks` (the `kinfolk_lab_*` lm-eval tasks), `replication` (running an experiment over
families), `atlantis_experiment`, `atlas_experiment` and `adapt_experiment` (`kinfolk lab experiment ...`),
`protocol` (the experiment framework that enforces `docs/protocol.md`: plans, selection views, typed records, the
runner and its statistics; `protocol.EXPERIMENTS` lists the experiments), `atlantis`, `atlas` and `adapt` (each
experiment's protocol-2 package), `results_doc` (docs/results.md from the results JSON), `report` (report.md and
plots) and `demo` (`kinfolk demo`). The command line is `kinfolk.commands.lab`. Nothing heavy is imported here.
"""
