"""`python -m kinfolk.lab.experiments.adapt_controls [--families F ...] [--runs R ...]`: the adapt-controls plan's runs.

Builds each ADAPT family (cached in the lab cache), then per distillation seed distils, patches, measures and routes
(models under `runs/adapt-controls/`); a run's record goes to `docs/results/adapt-controls-families/` once whole.
Processes started alike share the runs (each claims one no live process holds), so two one-thread processes use
both cores; a stopped one resumes from its kept models. `python -m kinfolk.lab.protocol analyse adapt-controls` then
reads the records under the committed plan."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from kinfolk.lab.experiments.adapt_controls.experiment import AdaptControls
    from kinfolk.lab.experiments.adapt_controls.runs import AdaptControlsRuns as FamilyRuns
    from kinfolk.lab.protocol.family_runs_cli import main

    sys.exit(main("python -m kinfolk.lab.experiments.adapt_controls", AdaptControls, FamilyRuns, sys.argv[1:]))
