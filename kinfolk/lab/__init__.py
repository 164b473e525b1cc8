"""The lab: a tiny model family trained on the CPU with kinfolk's own trainers, with ground truth by construction.

One idea per module: `tokenizer` (characters), `skills` (problems, formats, p* and p_d), `corpus` (datasets),
`training` (the lab's `WeightedSFTTrainer` recipe), `family` (`build_family`, cached by config hash), `evaluate`
(greedy skill scores), `tasks` (the `kinfolk_lab_*` lm-eval tasks), `demo` (`kinfolk demo`), `report`
(report.md and plots), `experiment` (`kinfolk lab experiment`), `cli` (`kinfolk lab`). Nothing heavy is imported
here.
"""
