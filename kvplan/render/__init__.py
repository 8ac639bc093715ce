"""Everything kvplan prints, in one place; renderers only read results.

tables.py: rich tables for plans, check-log, solve, models, GPUs and profiles;
rows.py: compare's table/md/csv/json; chart.py: the terminal curve and PNG/SVG charts;
jsonout.py: `--json` output and error objects (no rich import on that path).
May import every stage below it (kvplan.commands and down); never kvplan.api or kvplan.cli.
"""
