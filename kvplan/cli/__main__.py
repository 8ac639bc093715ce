"""`python -m kvplan.cli`: the same as the `kvplan` command."""

from kvplan.cli.app import main

main()
