"""The lab: a tiny model family trained on the CPU with kinfolk's own trainers, with ground truth by construction.

Four folders, each one kind of thing:

- `world/`: the simulated world and its models: `tokenizer` (characters), `skills` (problems, formats, p* and
  p_d), `corpus` (datasets), `training` (the lab's `WeightedSFTTrainer` recipe), `family` (`build_family`, cached
  by config hash), `members` (how each model is trained or reused), `digests` (the documented families' weight
  digests), `evaluate` (greedy skill scores), `tasks` (the `kinfolk_lab_*` lm-eval tasks), `heldout` (a real
  model measured against a reference on held-out rows).
- `protocol/`: the rules of `docs/protocol.md` as code: plans, selection views, typed records, the `Experiment`
  contract, the runner, its statistics, the results checker and the `actions` of `kinfolk lab experiment NAME
  plan|run|analyse`; `protocol.EXPERIMENTS` is the registry.
- `methods/`: what experiments share: ATLANTIS pools and scoring (`atlantis`), ATLAS runs and measurement
  (`atlas`), ADAPT families (`adapt`), the real checkpoints' text (`real_corpus`), one `selection` module and the
  on-disk `cache` of finished work.
- `experiments/`: one folder per registered experiment, `experiments/<name>/` (`settings`, `runs`, `experiment`,
  and `figure` where it has one).
- `demo/`: `kinfolk demo` (`pipeline`), its `report`, and the text of the README's evidence table (`evidence`) and
  of the results page (`results_page`) from the committed results.

Nothing heavy is imported here. The command line is `kinfolk.commands.lab`.
"""
