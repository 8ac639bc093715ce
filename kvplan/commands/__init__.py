"""What the commands do with what the user typed, before any output: flags, --gpus, logs and
saved measurements into requests and runs (inputs.py), and the compare commands' tables and
ladders (comparisons.py). Shared by kvplan.api and kvplan.cli. May import kvplan.search,
kvplan.logs and every stage below them; never kvplan.render, kvplan.api or kvplan.cli.
"""
