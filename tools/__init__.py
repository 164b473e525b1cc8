"""Development tools that are not part of the installed package (`make real-models` runs `real_models.py`,
`make results-page` runs `results_page.py`)."""
