"""The `kvplan` command line: parse flags, call the planner, render. Nothing else."""

from __future__ import annotations

from typing import Annotated

import typer

from kvplan.cliutil import load_cluster, reports_errors, to_json
from kvplan.errors import KvplanError, UsageError


class _LazyGroup(typer.core.TyperGroup):
    """`kvplan compare` is loaded only when asked for (or listed by --help): a plain estimate
    does not pay for building its three commands."""

    def list_commands(self, ctx):
        return [*super().list_commands(ctx), "compare"]

    def get_command(self, ctx, name):
        if name == "compare":
            from kvplan.compare_cli import app as compare_app

            group = typer.main.get_command(compare_app)
            group.name = "compare"
            return group
        return super().get_command(ctx, name)


app = typer.Typer(
    cls=_LazyGroup,
    add_completion=False,
    no_args_is_help=True,
    help="KV-cache capacity planner: how many GPUs, which context, which KV dtype, how many users.",
    pretty_exceptions_enable=False,
)


def _console(json_out: bool = False):
    from rich.console import Console  # rich is loaded only to print tables (not for --json)

    return Console(stderr=json_out, soft_wrap=False)


@app.command()
@reports_errors
def estimate(
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="Shipped name/alias/HF id, a spec .yaml, or a Hugging Face config.json."
        ),
    ],
    gpus: Annotated[
        str, typer.Option("--gpus", "-g", help="GPU type and count: H100, 8xH100, 2x8xH100 (nodes x GPUs).")
    ] = "H100",
    max_model_len: Annotated[
        str | None,
        typer.Option(
            "--max-model-len",
            "--context",
            help="Context length each request may reach (default: the model's maximum). 8192 or 8K.",
        ),
    ] = None,
    avg_context: Annotated[
        str | None,
        typer.Option("--avg-context", help="Also report concurrency at this average context length."),
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(
            "--gpu-memory-utilization",
            help="vLLM: fraction of each GPU's memory it may use (default 0.92; 0.9 before vLLM 0.20).",
        ),
    ] = None,
    kv_cache_dtype: Annotated[
        str,
        typer.Option(
            "--kv-cache-dtype",
            help="auto (the model's activation dtype), fp16, bf16, fp32, fp8, fp8_e4m3, fp8_e5m2, int8, int4, int2.",
        ),
    ] = "auto",
    kv_quant_group_size: Annotated[
        int | None,
        typer.Option(
            "--kv-quant-group-size",
            help="Values per quantization group for int8/int4/int2 KV (0: one scale per layer). Default: int4/int2 64, int8/fp8 0.",
        ),
    ] = None,
    kv_quant_scale_bits: Annotated[
        int | None, typer.Option("--kv-quant-scale-bits", help="Bits of each group scale (default 16).")
    ] = None,
    kv_quant_zero_point: Annotated[
        bool | None,
        typer.Option(
            "--kv-quant-zero-point/--kv-quant-no-zero-point",
            help="Store a zero-point per group too (default: yes for int4/int2).",
        ),
    ] = None,
    weight_dtype: Annotated[
        str | None,
        typer.Option(
            "--weight-dtype",
            help="Override the weights' dtype: bf16, fp16, fp32, fp8, int8, int4, mxfp4, nvfp4.",
        ),
    ] = None,
    block_size: Annotated[
        int | None,
        typer.Option(
            "--block-size",
            "--page-size",
            help="Block (vLLM) or page (SGLang) size in tokens. Default: vLLM 16 (MLA: 64 on Hopper, "
            "128 on Blackwell), SGLang 1.",
        ),
    ] = None,
    tensor_parallel_size: Annotated[
        int | None, typer.Option("--tensor-parallel-size", "-tp", help="Default: the GPUs of one node.")
    ] = None,
    pipeline_parallel_size: Annotated[
        int | None, typer.Option("--pipeline-parallel-size", "-pp", help="Default: the number of nodes.")
    ] = None,
    enable_prefix_caching: Annotated[
        bool,
        typer.Option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="As in vLLM (on by default); sharing is modelled when --shared-prefix-tokens is given.",
        ),
    ] = True,
    shared_prefix_tokens: Annotated[
        str,
        typer.Option(
            "--shared-prefix-tokens",
            help="Tokens of a prefix (system prompt, document) shared across requests.",
        ),
    ] = "0",
    prefix_hit_rate: Annotated[
        float, typer.Option("--prefix-hit-rate", help="Fraction of requests that share that prefix.")
    ] = 1.0,
    max_num_batched_tokens: Annotated[
        str,
        typer.Option(
            "--max-num-batched-tokens", help="Tokens per forward pass; sizes the activation reserve."
        ),
    ] = "8192",
    max_num_seqs: Annotated[
        int | None, typer.Option("--max-num-seqs", help="Cap on concurrent requests, as the engine's flag.")
    ] = None,
    kv_cache_memory: Annotated[
        str | None,
        typer.Option(
            "--kv-cache-memory",
            help="KV cache memory per GPU (51.02GiB, 40GB, bytes); replaces the computed budget.",
        ),
    ] = None,
    reserve_memory: Annotated[
        str | None,
        typer.Option(
            "--reserve-memory",
            help="vLLM: activation/workspace reserve per GPU; SGLang: memory in use at startup. Replaces the estimate.",
        ),
    ] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="Whose accounting and log lines to reproduce: vllm or sglang.")
    ] = "vllm",
    engine_version: Annotated[
        str | None,
        typer.Option(
            "--engine-version", help="Engine release, e.g. 0.11 (default: the newest kvplan knows)."
        ),
    ] = None,
    num_gpu_blocks_override: Annotated[
        int | None,
        typer.Option(
            "--num-gpu-blocks-override", help="vLLM: KV blocks per GPU; replaces the computed budget."
        ),
    ] = None,
    disable_hybrid_kv_cache_manager: Annotated[
        bool,
        typer.Option(
            "--disable-hybrid-kv-cache-manager", help="vLLM: treat sliding-window layers as full attention."
        ),
    ] = False,
    enforce_eager: Annotated[
        bool, typer.Option("--enforce-eager", help="vLLM: no CUDA graphs (none reserved for them).")
    ] = False,
    mem_fraction_static: Annotated[
        float | None,
        typer.Option(
            "--mem-fraction-static",
            help="SGLang: weights + KV pool as a fraction of memory (default: SGLang's).",
        ),
    ] = None,
    swa_full_tokens_ratio: Annotated[
        float,
        typer.Option(
            "--swa-full-tokens-ratio", help="SGLang: sliding-window pool size / full-attention pool."
        ),
    ] = 0.8,
    disable_hybrid_swa_memory: Annotated[
        bool,
        typer.Option("--disable-hybrid-swa-memory", help="SGLang: one pool for all layers, no SWA pool."),
    ] = False,
    calibration: Annotated[
        bool,
        typer.Option(
            "--calibration/--no-calibration",
            help="Use what this machine measured: a non-KV overhead saved by `check-log --save-calibration` "
            "and a bandwidth profile from `kvplan calibrate` for this GPU.",
        ),
    ] = True,
    calibration_file: Annotated[
        str | None,
        typer.Option(
            "--calibration-file", help="A `kvplan calibrate` profile to take decode bandwidth from."
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the whole plan as JSON (schema in the README).")
    ] = False,
    explain: Annotated[
        bool, typer.Option("--explain", help="Trace each number to its formula and spec field.")
    ] = False,
) -> None:
    """How a model fits on GPUs: weights, KV budget, KV per token, pool tokens, concurrent requests."""
    from kvplan.plan import PlanRequest
    from kvplan.plan import estimate as run_estimate
    from kvplan.specs.registry import load_model
    from kvplan.units import parse_bytes, parse_count

    gpu, num_gpus, nodes = load_cluster(gpus)
    spec = load_model(model)
    mnbt = parse_count(max_num_batched_tokens, "--max-num-batched-tokens")
    reserve_bytes = parse_bytes(reserve_memory, "--reserve-memory") if reserve_memory else None
    reserve_source = None
    if calibration and reserve_bytes is None and kv_cache_memory is None and num_gpu_blocks_override is None:
        reserve_bytes, reserve_source = _calibrated_reserve(
            spec.name,
            gpu,
            engine.lower(),
            num_gpus,
            nodes or 1,
            tensor_parallel_size,
            pipeline_parallel_size,
            mnbt,
        )
    bandwidth = _bandwidth_profile(gpu, calibration, calibration_file)
    req = PlanRequest(
        model=spec,
        gpu=gpu,
        num_gpus=num_gpus,
        nodes=nodes,
        tp=tensor_parallel_size,
        pp=pipeline_parallel_size,
        max_model_len=parse_count(max_model_len, "--max-model-len") if max_model_len else None,
        avg_context_tokens=parse_count(avg_context, "--avg-context") if avg_context else None,
        kv_cache_dtype=kv_cache_dtype,
        kv_quant_group_size=kv_quant_group_size,
        kv_quant_scale_bits=kv_quant_scale_bits,
        kv_quant_zero_point=kv_quant_zero_point,
        weight_dtype=weight_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory_bytes=parse_bytes(kv_cache_memory, "--kv-cache-memory") if kv_cache_memory else None,
        reserve_bytes=reserve_bytes,
        reserve_source=reserve_source,
        max_num_batched_tokens=mnbt,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        engine=engine.lower(),
        engine_version=engine_version,
        num_gpu_blocks_override=num_gpu_blocks_override,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
        enforce_eager=enforce_eager,
        mem_fraction_static=mem_fraction_static,
        swa_full_tokens_ratio=swa_full_tokens_ratio,
        disable_hybrid_swa_memory=disable_hybrid_swa_memory,
        enable_prefix_caching=enable_prefix_caching,
        **bandwidth,
        shared_prefix_tokens=parse_count(shared_prefix_tokens, "--shared-prefix-tokens"),
        prefix_hit_rate=prefix_hit_rate,
    )
    plan = run_estimate(req)
    if json_out:
        typer.echo(to_json(plan.to_dict()))
        return
    from kvplan.render import render_plan

    render_plan(plan, _console(), explain=explain)


def _bandwidth_profile(gpu, use_saved: bool, path: str | None) -> dict:
    """PlanRequest fields for a measured decode bandwidth: a named profile, else this GPU's saved one."""
    from pathlib import Path

    from kvplan.userdata import profile_path

    if not path and not (use_saved and profile_path(gpu.name).exists()):
        return {}  # nothing to read: the calibration module need not even load
    from kvplan import calibrate

    found = (calibrate.load(Path(path)), Path(path)) if path else calibrate.find_for(gpu.name)
    if found is None:
        return {}
    prof, where = found
    return {
        "decode_bandwidth_bytes_per_s": prof.fit.peak_bytes_per_s,
        "decode_bandwidth_half_bytes": prof.fit.half_bytes,
        "decode_bandwidth_source": prof.describe(where),
    }


def _calibrated_reserve(model, gpu, engine, num_gpus, nodes, tp, pp, mnbt) -> tuple[int | None, str | None]:
    """A saved non-KV overhead for this exact setup, if `check-log --save-calibration` recorded one."""
    from kvplan.userdata import overheads_path

    path = overheads_path()
    if not path.exists():
        return None, None
    from kvplan import overheads
    from kvplan.parallel import make_layout

    try:
        layout = make_layout(num_gpus, gpu.gpus_per_node, nodes, tp, pp)
    except KvplanError:
        return None, None  # the planner reports the bad layout itself
    entry = overheads.find(path, model, gpu.name, engine, layout.tp, layout.pp, mnbt)
    if entry is None:
        return None, None
    return entry.reserve_bytes, entry.describe(path)


@app.command()
@reports_errors
def calibrate(
    device: Annotated[
        str, typer.Option("--device", help="cuda (the local GPU) or cpu (the torch reference on this CPU).")
    ] = "cuda",
    quick: Annotated[
        bool, typer.Option("--quick", help="A small sweep (target: under 2 minutes on an H100).")
    ] = False,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Use this model's head layout (default: GQA 32/8 x 128)."),
    ] = None,
    kv_dtype: Annotated[
        str | None,
        typer.Option("--kv-dtype", help="Comma list: bf16, fp16, fp8, int8 (default: bf16, + fp8 on sm89+)."),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Where to write the profile (default: kvplan's data dir)."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
) -> None:
    """Measure what kvplan's paged decode kernel reaches on this GPU and save it for estimate."""
    from pathlib import Path

    from kvplan import calibrate as cal
    from kvplan.specs.registry import all_gpus, load_model

    if device not in ("cuda", "cpu"):
        raise UsageError(f"--device must be cuda or cpu, got {device!r}")
    layout = cal.model_layout(load_model(model)) if model else dict(cal.STANDARD_LAYOUT)
    torch = cal._require_torch(device)
    if kv_dtype:
        dtypes = [d.strip() for d in kv_dtype.split(",") if d.strip()]
    elif device == "cuda" and torch.cuda.get_device_capability(0) >= (8, 9):
        dtypes = ["bf16", "fp8"]  # Triton's fp8e4nv needs sm89 or newer (kernels.md)
    else:
        dtypes = ["bf16"]
    from rich.console import Console

    err = Console(stderr=True, soft_wrap=True)
    prof = cal.run(device, quick, layout, dtypes, all_gpus(), lambda line: err.print(line, highlight=False))
    path = Path(output) if output else cal.default_path(prof.gpu_spec or prof.device_name)
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise UsageError(f"--output {path}: profiles are YAML; name it .yaml")
    cal.save(prof, path)
    if json_out:
        import dataclasses

        typer.echo(to_json({**dataclasses.asdict(prof), "path": str(path)}))
        return
    from kvplan.render import render_profile

    render_profile(prof, path, _console())


@app.command("check-log")
@reports_errors
def check_log(
    log_file: Annotated[
        str | None, typer.Argument(help="A vLLM or SGLang startup log; '-' or nothing reads stdin.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="The model, if the log's name is not a shipped one (or a config.json)."
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", "-g", help="The GPU type, if the log's total memory does not tell."),
    ] = None,
    engine_version: Annotated[
        str | None, typer.Option("--engine-version", help="The engine release, if the log does not say.")
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None, typer.Option("--gpu-memory-utilization", help="vLLM, if not in the log.")
    ] = None,
    mem_fraction_static: Annotated[
        float | None, typer.Option("--mem-fraction-static", help="SGLang, if not in the log.")
    ] = None,
    block_size: Annotated[int | None, typer.Option("--block-size", help="If not in the log.")] = None,
    max_num_batched_tokens: Annotated[
        str | None, typer.Option("--max-num-batched-tokens", help="If not in the log (vLLM default 8192).")
    ] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option("--kv-cache-dtype", help="If not in the log.")] = None,
    weight_dtype: Annotated[str | None, typer.Option("--weight-dtype", help="Weights as served.")] = None,
    save_calibration: Annotated[
        bool,
        typer.Option(
            "--save-calibration",
            help="Save the measured non-KV memory for this model/GPU/engine/layout; estimate then uses it.",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Hold a pasted vLLM/SGLang startup log against kvplan: the same numbers, side by side, and why they differ."""
    import datetime
    import sys
    from pathlib import Path

    from kvplan import overheads
    from kvplan.checklog import check, infer_gpu, request_from_log
    from kvplan.logparse import found_numbers, parse
    from kvplan.specs.registry import all_gpus, load_model
    from kvplan.units import parse_count

    if log_file in (None, "-"):
        if log_file is None and sys.stdin.isatty():
            raise UsageError(
                "give a log file, or pipe the startup log in: vllm serve ... 2>&1 | kvplan check-log"
            )
        text, source = sys.stdin.read(), "stdin"
    else:
        path = Path(log_file)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"{log_file}: cannot read ({exc.strerror or exc})") from None
        source = path.name
    log = parse(text)
    if log.engine is None or not found_numbers(log):
        raise UsageError(
            f"{source}: no vLLM or SGLang KV-cache lines found (looked for 'GPU KV cache size', "
            "'Available KV cache memory', '# GPU blocks', 'KV Cache is allocated'); paste the engine's startup log"
        )
    model_ref = model or log.get("model")
    if not model_ref:
        raise UsageError(f"{source}: the log does not name the model; pass --model")
    try:
        spec = load_model(model_ref)
    except KvplanError as exc:
        if model:
            raise
        raise UsageError(
            f"{exc}; the log names {model_ref!r}: pass --model NAME or its config.json"
        ) from None
    if gpus:
        gpu = load_cluster(gpus)[0]
    else:
        total = log.get("total_gpu_memory_bytes")
        gpu = infer_gpu(total, all_gpus()) if total else None
        if gpu is None:
            raise UsageError(f"{source}: the log does not say which GPU; pass --gpus, e.g. --gpus H100")
    overrides = {
        "engine_version": engine_version,
        "gpu_memory_utilization": gpu_memory_utilization,
        "mem_fraction_static": mem_fraction_static,
        "block_size": block_size,
        "max_num_batched_tokens": parse_count(max_num_batched_tokens, "--max-num-batched-tokens")
        if max_num_batched_tokens
        else None,
        "kv_cache_dtype": kv_cache_dtype,
        "weight_dtype": weight_dtype,
    }
    result = check(log, request_from_log(log, spec, gpu, overrides))
    saved = None
    if save_calibration:
        if result.measured_reserve_bytes is None:
            raise UsageError(f"{source}: the log gives no KV memory figure to calibrate from")
        if result.measured_reserve_bytes < 0:
            raise UsageError(
                f"{source}: the log's KV memory exceeds kvplan's budget before any reserve; "
                "fix --gpus/--gpu-memory-utilization/--weight-dtype first"
            )
        saved = overheads.default_path()
        setup = result.setup
        overheads.save(
            saved,
            overheads.Overhead(
                model=spec.name,
                gpu=gpu.name,
                engine=result.engine,
                tensor_parallel_size=setup.tensor_parallel_size,
                pipeline_parallel_size=setup.pipeline_parallel_size,
                max_num_batched_tokens=setup.max_num_batched_tokens,
                reserve_bytes=result.measured_reserve_bytes,
                engine_version=result.version,
                measured_on=datetime.date.today().isoformat(),
                source=source,
            ),
        )
    if json_out:
        typer.echo(to_json({**result.to_dict(), "calibration_saved": str(saved) if saved else None}))
        return
    from kvplan.render import render_check

    render_check(result, _console(), source, saved)


@app.command()
@reports_errors
def solve(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Shipped name/alias/HF id, a spec .yaml or a config.json.")
    ],
    users: Annotated[int, typer.Option("--users", "-u", help="Concurrent requests to serve.")],
    max_model_len: Annotated[
        str | None,
        typer.Option(
            "--max-model-len", "--context", help="Context each request may reach (not with --max-context)."
        ),
    ] = None,
    gpu: Annotated[
        str, typer.Option("--gpu", help="GPU type(s) to consider, comma-separated: H100 or H100,H200,B200.")
    ] = "H100",
    tpot_ms: Annotated[
        float | None,
        typer.Option("--tpot-ms", help="Time per output token at full load must stay under this."),
    ] = None,
    kv_cache_dtype: Annotated[
        str,
        typer.Option(
            "--kv-cache-dtype", help="any (the engine's: auto, fp8) or a comma list, e.g. auto or fp8."
        ),
    ] = "any",
    max_gpus: Annotated[int, typer.Option("--max-gpus", help="Largest GPU count to consider.")] = 64,
    price: Annotated[
        str | None,
        typer.Option("--price", help="Price per GPU-hour, one per --gpu type (e.g. 2.5,3.8): rank by cost."),
    ] = None,
    max_context: Annotated[
        bool,
        typer.Option(
            "--max-context", help="Instead: on --gpus, the longest context --users requests can have."
        ),
    ] = False,
    gpus: Annotated[
        str | None, typer.Option("--gpus", "-g", help="With --max-context: the GPUs you have, e.g. 8xH200.")
    ] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="Accounting to size with: vllm or sglang.")
    ] = "vllm",
    block_size: Annotated[int | None, typer.Option("--block-size", help="Force a block size.")] = None,
    gpu_memory_utilization: Annotated[
        float | None, typer.Option("--gpu-memory-utilization", help="vLLM's fraction (default 0.92).")
    ] = None,
    top: Annotated[int, typer.Option("--top", help="How many answers to show.")] = 5,
    json_out: Annotated[bool, typer.Option("--json", help="Print the answers as JSON, best first.")] = False,
) -> None:
    """The inverse question: the fewest (or cheapest) GPUs, layout and KV dtype for N users; or the longest context."""
    from kvplan.solve import ENGINE_DTYPES, Query, verdict
    from kvplan.solve import solve as run_solve
    from kvplan.specs.registry import load_gpu, load_model
    from kvplan.units import parse_count

    spec = load_model(model)
    gpu_specs = tuple(load_gpu(g.strip()) for g in gpu.split(",") if g.strip())
    fixed = None
    if max_context:
        if not gpus or max_model_len:
            raise UsageError("--max-context needs --gpus (e.g. 8xH200) and no --max-model-len")
        cluster_gpu, n, _ = load_cluster(gpus)
        gpu_specs = (cluster_gpu,)
        fixed = n or 1
    elif gpus:
        raise UsageError("--gpus goes with --max-context; to search GPU types use --gpu H100,H200")
    elif not max_model_len:
        raise UsageError(
            "give --max-model-len (or ask for the longest context with --max-context --gpus NxGPU)"
        )
    dtypes = ENGINE_DTYPES if kv_cache_dtype == "any" else tuple(d.strip() for d in kv_cache_dtype.split(","))
    prices = None
    if price:
        values = [float(x) for x in price.split(",")]
        if len(values) not in (1, len(gpu_specs)) or any(v <= 0 for v in values):
            raise UsageError("--price: one positive price per --gpu type (or one for all)")
        prices = {g.name: values[0 if len(values) == 1 else i] for i, g in enumerate(gpu_specs)}
    q = Query(
        model=spec,
        gpus=gpu_specs,
        users=users,
        max_model_len=parse_count(max_model_len, "--max-model-len") if max_model_len else None,
        tpot_ms=tpot_ms,
        kv_dtypes=dtypes,
        max_gpus=max_gpus,
        prices=prices,
        engine=engine.lower(),
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
        fixed_num_gpus=fixed,
        top=top,
    )
    answers, bounds = run_solve(q)
    if not answers:
        from kvplan.errors import InfeasibleError

        raise InfeasibleError(verdict(q, bounds))

    if json_out:
        from kvplan.solve import SCHEMA

        typer.echo(
            to_json(
                {
                    "schema": SCHEMA,
                    "mode": "max-context" if max_context else "min-gpus",
                    "model": spec.name,
                    "targets": {
                        "users": users,
                        "max_model_len": q.max_model_len,
                        "tpot_ms": tpot_ms,
                        "max_gpus": max_gpus,
                        "gpus": [g.name for g in gpu_specs],
                        "kv_cache_dtypes": list(dtypes),
                        "num_gpus": fixed,
                    },
                    "answers": [a.to_dict() for a in answers],
                }
            )
        )
        return
    from kvplan.render import render_solve

    render_solve(q, answers, _console(), max_context)


@app.command()
@reports_errors
def models(json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False) -> None:
    """List the shipped model specs."""
    from kvplan.specs.registry import all_models

    specs = all_models()
    if json_out:
        from kvplan.formats import KV_DTYPES
        from kvplan.kv import model_bits_per_token

        bf16 = KV_DTYPES["bf16"]
        typer.echo(
            to_json(
                [
                    {
                        "name": m.name,
                        "hf_id": m.hf_id,
                        "aliases": m.aliases,
                        "num_layers": m.num_layers,
                        "attention": m.attention_summary,
                        "kv_bytes_per_token_bf16": model_bits_per_token(m.layers, bf16) // 8,
                        "kv_bytes_per_token_growing_bf16": model_bits_per_token(
                            m.layers, bf16, growing_only=True
                        )
                        // 8,
                        "max_context": m.max_context,
                        "sources": m.sources,
                    }
                    for m in specs
                ]
            )
        )
        return
    from kvplan.render import render_models

    render_models(specs, _console())


@app.command()
@reports_errors
def gpus(json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False) -> None:
    """List the shipped GPU specs."""
    from kvplan.specs.registry import all_gpus

    specs = all_gpus()
    if json_out:
        typer.echo(to_json([g.model_dump() for g in specs]))
        return
    from kvplan.render import render_gpus

    render_gpus(specs, _console())


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
