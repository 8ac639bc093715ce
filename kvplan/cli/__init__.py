"""The `kvplan` command line: each command parses its flags, makes one call into kvplan, renders.

The top stage: may import any other."""

from kvplan.cli.app import app, main

__all__ = ["app", "main"]
