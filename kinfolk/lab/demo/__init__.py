"""`kinfolk demo`: `pipeline` (the three methods on one family), `report` (report.md, the headline and its plots),
`results_page` (the text of docs/results.md's generated blocks) and `evidence` (the README's evidence table and the
headline's evidence lines, from each question's newest experiment). Figures are drawn with `kinfolk.figures`;
`tools/results_page.py` writes the generated documents into a checkout."""
