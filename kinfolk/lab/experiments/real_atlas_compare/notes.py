"""The plan's notes: why this design, what the pilot saw, and what the runs cost (written before any unit ran)."""

NOTES = [
    "Version 2 of the real-checkpoint ATLAS question (issue 49), written after version 1's results were seen: version "
    "1 measured 4 rows per retained source, chose Output-KL's strength on the edge of its grid and had its own "
    "selection rule. Here every run is trained and measured by kinfolk compare's code (its plan, grid, claims and "
    "analysis), on 64 validation and 64 test rows per retained source and of the target, drawn per seed.",
]
