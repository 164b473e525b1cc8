"""`python -m kinfolk.lab.experiments.atlas_controls [--families F ...] [--runs R ...]`: the atlas-controls plan's runs.

Builds each ATLAS family (cached in the lab cache), then trains every method at every grid point on every target,
keeping each run under `runs/atlas-controls/`; a run's record goes to `docs/results/atlas-controls-families/` once
whole. Processes started alike share the runs (each claims what no live process holds), so two one-thread processes
use both cores; a stopped one resumes. `python -m kinfolk.lab.protocol analyse atlas-controls` then reads the
records under the committed plan."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from kinfolk.lab.experiments.atlas_controls.experiment import AtlasControls
    from kinfolk.lab.experiments.atlas_controls.runs import AtlasControlsRuns as FamilyRuns
    from kinfolk.lab.protocol.family_runs_cli import main

    sys.exit(main("python -m kinfolk.lab.experiments.atlas_controls", AtlasControls, FamilyRuns, sys.argv[1:]))
