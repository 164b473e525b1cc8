"""`kinfolk demo`: `pipeline` (the three methods on one family), `report` (report.md, the headline and its plots),
`results_page` (docs/results.md's generated blocks), `evidence` (the README's evidence table and the headline's
evidence lines, from each question's newest experiment) and `plots` (figure helpers)."""
