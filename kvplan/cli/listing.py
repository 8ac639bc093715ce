"""`kvplan models` and `kvplan gpus`: what kvplan ships."""

from __future__ import annotations

import typer

from kvplan.cli import options as o
from kvplan.cli.app import console, reports_errors


@reports_errors
def models(json_out: o.Json = False) -> None:
    """List the shipped model specs."""
    from kvplan.specs.registry import all_models

    specs = all_models()
    if json_out:
        from kvplan.render.jsonout import models_json, to_json

        typer.echo(to_json(models_json(specs)))
        return
    from kvplan.render.tables import render_models

    render_models(specs, console())


@reports_errors
def gpus(json_out: o.Json = False) -> None:
    """List the shipped GPU specs."""
    from kvplan.specs.registry import all_gpus

    specs = all_gpus()
    if json_out:
        from kvplan.render.jsonout import gpus_json, to_json

        typer.echo(to_json(gpus_json(specs)))
        return
    from kvplan.render.tables import render_gpus

    render_gpus(specs, console())
