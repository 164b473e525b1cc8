"""`kinfolk demo`: `pipeline` (the three methods on one family), `report` (report.md, the headline and its plots),
`results_page` (docs/results.md's generated blocks) and `plots` (figure helpers)."""
