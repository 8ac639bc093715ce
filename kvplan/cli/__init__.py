"""The `kvplan` command line: each command parses its flags, makes one call into kvplan, renders."""

from kvplan.cli.app import app, main

__all__ = ["app", "main"]
