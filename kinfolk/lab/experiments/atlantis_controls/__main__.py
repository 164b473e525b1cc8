"""`python -m kinfolk.lab.experiments.atlantis_controls [--families F ...] [--runs R ...]`: the atlantis-controls plan's runs.

Builds each family's strong and weak large bases (cached in the lab cache), scores the pools and trains every arm,
keeping each result under `runs/atlantis-controls/`; a run's record goes to `docs/results/atlantis-controls-families/`
once whole. Processes started alike share the work (each claims what no live process holds), so two one-thread
processes use both cores; a stopped one resumes. `python -m kinfolk.lab.protocol analyse atlantis-controls` then
reads the records under the committed plan.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from kinfolk.lab.experiments.atlantis_controls.experiment import AtlantisControls
    from kinfolk.lab.experiments.atlantis_controls.runs import AtlantisControlsRuns as FamilyRuns
    from kinfolk.lab.protocol.family_runs_cli import main

    sys.exit(main("python -m kinfolk.lab.experiments.atlantis_controls", AtlantisControls, FamilyRuns, sys.argv[1:]))
