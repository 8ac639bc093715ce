"""`kvplan calibrate`."""

from __future__ import annotations

from typing import Annotated

import typer

from kvplan.cli import options as o
from kvplan.cli.app import console, make_console, reports_errors
from kvplan.errors import UsageError


@reports_errors
def calibrate(
    device: Annotated[
        str, typer.Option("--device", help="cuda (the local GPU) or cpu (the torch reference on this CPU).")
    ] = "cuda",
    quick: Annotated[
        bool, typer.Option("--quick", help="A small sweep (target: under 2 minutes on an H100).")
    ] = False,
    model: o.MaybeModel = None,
    kv_cache_dtype: Annotated[
        str | None,
        typer.Option(
            "--kv-cache-dtype", help="Comma list: bf16, fp16, fp8, int8 (default: bf16, + fp8 on sm89+)."
        ),
    ] = None,
    kv_dtype: Annotated[  # the flag's old name, kept for scripts that use it
        str | None, typer.Option("--kv-dtype", hidden=True, help="Deprecated: --kv-cache-dtype.")
    ] = None,
    output: o.Output = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing --output file that is not a kvplan profile.")
    ] = False,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            help="Comma list of parts: kernel, gemm, launch, allreduce (default: the first three, and "
            "allreduce over all local GPUs when there are several).",
        ),
    ] = None,
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            "--nproc-per-node", help="Processes for the all-reduce, one per GPU (default: every GPU; cpu: 2)."
        ),
    ] = None,
    json_out: o.Json = False,
) -> None:
    """Measure this GPU for the decode step model and save a profile that estimate uses.

    Parts: kvplan's paged decode kernel (--model takes that model's head layout, default GQA 32/8 x
    128), decode-shaped GEMMs (bf16, fp16, fp8 on sm89+), the kernel launch floor, and all-reduces
    over the local GPUs (torchrun; across nodes run `torchrun ... -m kvplan.calibrate.dist`).
    --output is the profile's path (default: kvplan's data dir)."""

    from kvplan.calibrate.run import measure_and_save

    err = make_console(stderr=True, soft_wrap=True)  # progress goes to stderr, so --json stays parseable
    if kv_dtype is not None:
        if kv_cache_dtype is not None:
            raise UsageError("give --kv-cache-dtype only (--kv-dtype is its old name)")
        typer.echo("warning: --kv-dtype is deprecated; use --kv-cache-dtype, as every command does", err=True)
        kv_cache_dtype = kv_dtype
    prof, path = measure_and_save(
        device,
        quick,
        model,
        kv_cache_dtype,
        output,
        lambda line: err.print(line, highlight=False, markup=False),
        force,
        only=only,
        nproc=nproc_per_node,
    )
    if json_out:
        from kvplan.render.jsonout import profile_json, to_json

        typer.echo(to_json(profile_json(prof, path)))
        return
    from kvplan.render.tables import render_profile

    render_profile(prof, path, console())
