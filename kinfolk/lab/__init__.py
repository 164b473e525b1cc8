"""The lab: a tiny model family trained on the CPU with kinfolk's own trainers, with ground truth by construction.

One idea per module: `tokenizer` (characters), `skills` (problems, formats, p* and p_d), `corpus` (datasets),
`training` (the lab's `WeightedSFTTrainer` recipe), `family` (`build_family`, cached by config hash), `members`
(how each model is trained or reused), `digests` (the documented families' weight digests), `evaluate` (greedy
skill scores), `tasks` (the `kinfolk_lab_*` lm-eval tasks), `replication` (running an experiment over families),
`protocol` (the experiment framework that enforces `docs/protocol.md`: plans, selection views, typed records, the
runner and its statistics; `protocol.EXPERIMENTS` lists the experiments), one package per experiment (`atlas`,
`adapt`, `atlantis`: its runs for `kinfolk lab experiment ...` and its protocol-2 re-analysis; ATLANTIS's runs are
still the module `atlantis_experiment`), `boomerang` (a real checkpoint's every size between its student and
itself, units = seeds), `real_atlas` (ATLAS against LoRA, its norm-matched control, OSF and Output-KL on a real
checkpoint, units = seeds), `heldout` (a model measured against a reference on held-out rows, for both), `plots` (figure helpers), `results_doc` (docs/results.md from the results
JSON), `report` (report.md and plots) and `demo` (`kinfolk demo`). The command line is `kinfolk.commands.lab`.
Nothing heavy is imported here.
"""
