"""`python -m kvplan`: the same as the `kvplan` command."""

from kvplan.cli import main

main()
