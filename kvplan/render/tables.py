"""Turning a Plan (or spec lists) into rich tables and JSON. Renderers only read."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.console import Console
from rich.markup import escape

from kvplan import engines
from kvplan.plan.disagg import Disaggregated
from kvplan.plan.plan import Plan, plan_header
from kvplan.render.layout import SafeTable, plain_table, stacked_tables
from kvplan.units import GiB, fmt_bytes, fmt_gib, plural


def _table(title: str, *columns: str) -> SafeTable:
    table = plain_table(title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right", no_wrap=i > 0)
    return table


def render_plan(plan: Plan, console: Console, explain: bool = False) -> None:
    setup, attention = plan_header(plan)
    name = plan.model.name
    # the model's name in bold; nothing else styled or highlighted (rich read "80x" as hex 0x)
    console.print(f"[bold]{escape(name)}[/]{escape(setup[len(name) :])}", highlight=False)
    console.print(attention, markup=False, highlight=False)
    console.print()

    _memory_table(plan, console)
    console.print()
    _kv_table(plan, console)
    console.print()
    _concurrency_table(plan, console)
    console.print()
    _render_speed(plan, console)
    _render_engine(plan, console)
    console.print("[bold]Assumptions[/]")
    for note in plan.assumptions:
        console.print(f"- {note}", markup=False)
    if explain:
        console.print()
        console.print("[bold]Where each number comes from[/]")
        for e in plan.explain:
            console.print(f"[bold]{escape(e.quantity)}[/] = {escape(str(e.value))}")
            console.print(f"    formula: {e.formula}", highlight=False, markup=False)
            console.print(f"    from:    {e.source}", highlight=False, markup=False)


_COMPONENT_WORDS = {"routed_experts": "experts", "shared_experts": "shared experts", "dense_mlp": "MLP",
                    "lm_head": "LM head"}  # fmt: skip


def _formats_label(s: Any) -> str:
    """The weights' formats as stored: the body's, then each component held in another (a quantized
    checkpoint's bf16 embedding, an MoE's fp8 experts), from settings.weight_formats."""
    formats = {k: v for k, v in (s.weight_formats or {}).items() if v}
    if not formats:
        other = s.expert_weight_dtype
        return s.weight_dtype + (f", experts {other}" if other and other != s.weight_dtype else "")
    body = [v for k, v in formats.items() if k not in ("embedding", "lm_head")] or list(formats.values())
    main = max(dict.fromkeys(body), key=body.count)
    rest: dict[str, list[str]] = {}
    for k, v in formats.items():
        if v != main:
            rest.setdefault(v, []).append(_COMPONENT_WORDS.get(k, k))
    return ", ".join([main, *(f"{' and '.join(names)} {v}" for v, names in rest.items())])


def _memory_table(plan: Plan, console: Console) -> None:
    c = plan.cluster
    n = c.num_gpus
    s = plan.settings
    mem = _table("Memory", "", "per GPU", f"cluster ({n} GPU{'s' if n > 1 else ''})")
    est = " (estimated)" if plan.reserve.estimated else " (given)"
    rows: list[tuple[str, int]] = []
    weights_label = f"- weights ({_formats_label(s)})"
    r = plan.reserve
    if plan.kv_budget_source == "computed" and s.mem_fraction_static is not None:
        loading = r.weight_loading_bytes  # SGLang takes it out of (memory - in use at startup) x fraction
        scaled = plan.requested_bytes_per_gpu + loading
        rows = [
            ("GPU memory (runtime total)", plan.memory_bytes_per_gpu),
            (f"- in use at startup{est}", plan.reserve_bytes_per_gpu),
            (f"x mem-fraction-static {s.mem_fraction_static:g}", scaled),
            *([(f"- taken by weight loading{est}", loading)] if loading > 0 else []),
            (weights_label, plan.weight_bytes_per_gpu),
        ]
    elif plan.kv_budget_source == "computed":
        rows = [
            ("GPU memory (runtime total)", plan.memory_bytes_per_gpu),
            (f"x gpu-memory-utilization {s.gpu_memory_utilization:g}", plan.requested_bytes_per_gpu),
            (weights_label, plan.weight_bytes_per_gpu),
            (f"- activation/workspace reserve{est}", plan.reserve_bytes_per_gpu),
        ]
        if r.estimated:
            larger = r.profile_peak_bytes != r.activation_bytes + r.sampler_bytes or not r.sampler_bytes
            rows += [
                ("    profiled peak: " + ("the larger of" if larger else "the sum of"), r.profile_peak_bytes),
                (f"      forward pass ({s.max_num_batched_tokens:,} batched tokens)", r.activation_bytes),
                ("      sampler" + (f": {r.sampler_path}" if r.sampler_path else ""), r.sampler_bytes),
                *(
                    [("        + the forward's hidden states it holds", r.sampler_hidden_bytes)]
                    if r.sampler_hidden_bytes
                    else []
                ),
                *(
                    [("      + dummy encoder tensors held", r.encoder_cache_bytes)]
                    if r.encoder_cache_bytes
                    else []
                ),
                ("    non-torch (CUDA/cuBLAS workspaces, NCCL)", r.non_torch_bytes),
            ]
            if r.cuda_graph_bytes:
                rows.append(("    CUDA graphs", r.cuda_graph_bytes))
    else:
        rows = [("weights (not deducted: budget given)", plan.weight_bytes_per_gpu)]
    draft = plan.speculative_memory
    # vLLM: the budget split with the draft
    if draft is not None and draft.in_budget and draft.kv_bytes_per_gpu:
        rows.append(
            (f"- the draft's share ({draft.method}, {draft.layers} layer(s))", draft.kv_bytes_per_gpu)
        )
    rows.append(
        (
            "= KV cache budget"
            + (f" ({plan.kv_budget_source})" if plan.kv_budget_source != "computed" else ""),
            plan.kv_budget_bytes_per_gpu,
        )
    )
    for label, value in rows:
        mem.add_row(label, fmt_gib(value), fmt_gib(value * n))
    console.print(mem)


def _kv_table(plan: Plan, console: Console) -> None:
    c = plan.cluster
    s = plan.settings
    kvt = _table("KV cache", "", "value")
    kvt.add_row("KV per token, whole model", fmt_bytes(plan.kv_bytes_per_token))
    kvt.add_row("KV per token, per GPU", fmt_bytes(plan.kv_bytes_per_token_per_gpu))
    if plan.kv_bytes_per_sequence_windowed_cap:
        kvt.add_row("KV per token, layers without a window", fmt_bytes(plan.kv_bytes_per_token_growing))
        kvt.add_row("windowed layers' cap per request", fmt_bytes(plan.kv_bytes_per_sequence_windowed_cap))
    kvt.add_row(f"KV per request at {s.max_model_len:,} tokens", fmt_gib(plan.kv_bytes_per_request))
    fixed = plan.kv_bytes_per_request_fixed  # recurrent state, image K/V: held per request, not per token
    if fixed:
        kvt.add_row("  of which fixed (state, image K/V)", fmt_bytes(fixed))
    kvt.add_row(f"  per GPU, in whole blocks{_capped_at(s)}", fmt_bytes(plan.kv_bytes_per_request_per_gpu))
    kvt.add_row("block (per-token layers, per GPU)" if fixed else "block (all layers, per GPU)",
                fmt_bytes(plan.block_bytes_per_gpu))  # fmt: skip
    if plan.num_blocks_per_gpu is not None:
        kvt.add_row("blocks per GPU", f"{plan.num_blocks_per_gpu:,}")
    # with fixed bytes a request's state takes blocks too: the pool's tokens are an upper bound no load reaches
    kvt.add_row(
        "KV pool per replica, before fixed state" if fixed else "KV pool per replica",
        f"{plan.kv_pool_tokens:,} tokens",
    )
    if c.data_parallel_size > 1:
        kvt.add_row("KV pool, cluster", f"{plan.kv_pool_tokens_cluster:,} tokens")
    console.print(kvt)


def _capped_at(s: Any, tokens: bool = True) -> str:
    """Where SGLang caps each request below --max-model-len (a pool smaller than one request): the rows
    computed at the cap say so."""
    if s.max_request_tokens >= s.max_model_len:
        return ""
    return f" (at max_req_len {s.max_request_tokens:,})" if tokens else " (SGLang's max_req_len)"


def _concurrency_table(plan: Plan, console: Console) -> None:
    c = plan.cluster
    s = plan.settings
    ct = _table("Concurrency", "", "requests")
    cap_flag = (
        "--max-running-requests"
        if s.engine == "sglang" and s.max_running_requests is not None
        else "--max-num-seqs"
    )
    limit = (
        f" (capped by {cap_flag}; memory holds {plan.pool_max_concurrency:,})"
        if plan.limited_by == "max_num_seqs"
        else " (capped by SGLang's state pool)"
        if plan.limited_by == "state_pool"
        else ""
    )
    ct.add_row(f"max concurrent requests at {s.max_request_tokens:,} tokens{_capped_at(s, False)}{limit}",
               f"{plan.max_concurrency:,}")  # fmt: skip
    ranks = max(1, c.attention_dp_size)  # SGLang DP attention: each rank holds its own requests' KV
    per = "per attention-DP rank" if ranks > 1 else "per replica"
    ct.add_row(f"  KV blocks / blocks one request holds, {per}", f"{plan.concurrency_factor:,.2f}x")
    if plan.avg_context:
        a = plan.avg_context
        ct.add_row(f"at an average context of {a.avg_context_tokens:,} tokens", f"{a.max_concurrency:,}")
    if plan.prefix_caching:
        p = plan.prefix_caching
        gain = f" ({p.gain:.2f}x)" if p.gain else ""
        ct.add_row(
            f"with a {p.shared_tokens_cached:,}-token shared prefix, {p.prefix_hit_rate:.0%} hits{gain}",
            f"{p.max_concurrency:,}",
        )
        ct.add_row("  KV memory saved per GPU", fmt_gib(p.memory_saved_bytes_per_gpu))
        ct.add_row("  prefill tokens skipped per request (avg)", f"{p.prefill_tokens_saved_per_request:,.0f}")
    f = plan.fragmentation
    if f.prealloc_max_concurrency_per_replica is not None:
        dp = c.data_parallel_size * ranks  # the whole deployment, as the headline above
        ct.add_row(
            f"preallocating max-model-len (no paging), at {f.context_tokens:,} tokens used",
            f"{f.prealloc_max_concurrency_per_replica * dp:,} ({f.prealloc_utilization:.0%} of reserved KV used)",
        )
        ct.add_row(
            "paged blocks at the same context",
            f"{(f.paged_max_concurrency_per_replica or 0) * dp:,} ({f.paged_utilization:.0%} of held KV used)",
        )
    console.print(ct)


def _render_speed(plan: Plan, console: Console) -> None:
    d = plan.decode
    kind = "partly measured" if d.measured else "estimated"
    t = _table(f"Decode speed per replica ({kind})", "", "weights read", "KV read", "decode step", "tokens/s")
    rows = [(f"batch 1 at {d.context_tokens:,} tokens", d.batch_1)]
    if d.at_max_concurrency:
        rows.append(
            (
                f"{plural(d.at_max_concurrency.batch, 'request')} at {d.at_max_concurrency.context_tokens:,} tokens",
                d.at_max_concurrency,
            )
        )
    a = plan.avg_context
    if d.at_avg_context and a is not None:
        rows.append(
            (
                f"{plural(d.at_avg_context.batch, 'request')} at {a.avg_context_tokens:,} tokens",
                d.at_avg_context,
            )
        )
    for label, r in rows:
        t.add_row(
            label,
            fmt_bytes(r.weight_bytes_read),
            fmt_bytes(r.kv_bytes_read),
            f"{r.tpot_ms:,.2f} ms",
            f"{r.tokens_per_s:,.0f}" if r.tokens_per_s >= 10 else f"{r.tokens_per_s:.3g}",
        )
    console.print(t)
    if d.served is not None:
        sv = d.served
        console.print(
            f"served TPOT at {plural(sv.batch, 'request')} of {sv.input_tokens:,} in / {sv.output_tokens:,} out: "
            f"{sv.tpot_ms:,.2f} ms (the {sv.step_ms:,.2f} ms "
            f"{'speculative TPOT (below)' if sv.speculative else 'decode step'} + the other requests' prompts "
            f"prefilled within the steps, {sv.batch - 1:,} x {sv.chunk_ms:,.1f} ms / {sv.output_tokens:,}; "
            "kvplan simulate replays the traffic)",
            highlight=False,
            markup=False,
        )
    for sp in d.speculative or []:
        console.print(
            f"speculative decoding ({sp.method}, {sp.draft_steps} draft / {sp.verify_tokens} verified tokens) at "
            f"{plural(sp.batch, 'request')}: TPOT {sp.tpot_ms:,.2f} ms per output token = (verify "
            f"{sp.verify_ms:,.2f} + draft {sp.draft_ms:,.2f} ms) / {sp.acceptance_length:.2f} tokens accepted a step "
            f"({sp.acceptance_source}; {sp.draft_source})",
            highlight=False,
            markup=False,
        )
    one = d.batch_1
    terms = [
        ("weights", one.weights_ms),
        ("attention", one.attention_ms),
        ("MoE", one.moe_ms),
        ("all-reduce", one.communication_ms),
        ("all-to-all", one.all_to_all_ms),
        ("PP hops", one.pp_hop_ms),
        ("launch", one.launch_ms),
        ("offload copy", one.offload_ms),
        ("overhead", one.overhead_ms),
    ]
    parts = ", ".join(f"{name} {ms:,.2f}" for name, ms in terms if ms)
    console.print(f"batch-1 step (ms): {parts}", highlight=False, markup=False)
    console.print(f"decode: {d.bandwidth_source}", highlight=False, markup=False)
    if d.held_out is not None:
        console.print(f"  {d.held_out.tpot_line()}", highlight=False, markup=False)
    if one.offload_ms:
        console.print(f"offload copy: {one.sources['offload']}", highlight=False, markup=False)
    pf = plan.prefill
    pt = pf.terms
    # the prefill's communication term holds the all-reduces, and the all-to-alls and pipeline hops
    # where the layout has them (prefill.py _work): named as the decode step's terms show them
    links = [name for name, ms in (("all-reduce", one.communication_ms), ("all-to-all", one.all_to_all_ms),
                                   ("PP hops", one.pp_hop_ms)) if ms] or ["all-reduce"]  # fmt: skip
    pf_terms = [("GEMMs", pt.gemm_ms), ("attention", pt.attention_ms), (" + ".join(links), pt.communication_ms),
                ("MoE acts", pt.moe_activation_ms), ("launch", pt.launch_ms),
                ("offload copy", pt.offload_ms), ("overhead", pt.overhead_ms)]  # fmt: skip
    pf_parts = ", ".join(f"{name} {ms:,.1f}" for name, ms in pf_terms if ms)
    console.print(
        f"prefill of one {pf.tokens:,}-token prompt alone (its TTFT): {pf.ms:,.0f} ms ({pf_parts} ms; "
        f"{pf.gemm_words}, {pf.source})",
        highlight=False,
        markup=False,
    )
    if pf.caveat:
        console.print(f"  caveat: {pf.caveat}", highlight=False, markup=False)
    if d.held_out is not None and (line := d.held_out.ttft_line()):
        console.print(f"  {line}", highlight=False, markup=False)
    console.print()


def _render_engine(plan: Plan, console: Console) -> None:
    e = plan.engine
    name = f"{engines.engine_class(e.engine).display_name} {e.version}"
    if not e.supported:
        console.print(f"[bold]{name}[/]: no engine figures ({escape(str(e.reason))})", highlight=False)
        console.print()
        return
    console.print(f"[bold]What {name} will log[/] (per GPU, from the same budget)")
    for line in e.log_lines:
        console.print(f"  {line}", highlight=False, markup=False)
    for note in e.differences:
        console.print(f"  note: {note}", highlight=False, markup=False)
    console.print()


def render_models(models: list, console: Console) -> None:
    from kvplan.formats import KV_DTYPES
    from kvplan.model.kv import model_bits_per_token

    headers = ["name", "HF id", "layers", "attention", "growing KV/token (bf16)", "max context"]
    rows = [
        [
            m.name,
            m.hf_id or "-",
            str(m.num_layers),
            m.attention_summary,
            fmt_bytes(model_bits_per_token(m.layers, KV_DTYPES["bf16"], growing_only=True) / 8),
            f"{m.max_context:,}",
        ]
        for m in models
    ]
    # never the name: at a narrow terminal the HF id goes first, then the layer count
    for t in stacked_tables(
        "Shipped models",
        headers,
        rows,
        console.width,
        drop_order=(1, 2),
        wraps=(3,),
        left=(0, 1, 3),
        texts=(1,),
    ):
        console.print(t)
    console.print(
        "KV/token: growing-layer KV, the layers whose cache grows with the context (windowed layers are "
        "capped at their window; `estimate` adds them per request).",
        highlight=False,
    )


def render_gpus(gpus: list, console: Console) -> None:
    # a GPU's name is what the user types: never cut it. Where the aliases do not fit on one line beside the
    # figures, they follow in a table of their own, beside the names
    headers = ["name", "aliases", "datasheet label", "runtime total", "HBM bandwidth", "bf16 dense"]
    rows = [
        [
            g.name,
            ", ".join(g.aliases) or "-",
            g.memory_marketing,
            f"{g.memory_bytes / GiB:,.2f} GiB",
            f"{g.hbm_bytes_per_s / 1e9:,.0f} GB/s",
            f"{g.bf16_dense_flops / 1e12:,.0f} TFLOP/s",
        ]
        for g in gpus
    ]
    for t in stacked_tables(
        "Shipped GPUs", headers, rows, console.width, drop_order=(1,), left=(0, 1), texts=(1,)
    ):
        console.print(t)


def _cell(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return fmt_gib(value)
    if unit == "x":
        return f"{value:,.2f}x"
    return f"{value:,.0f} {unit}"


def render_check(result, console: Console, source: str, saved) -> None:
    s = result.setup
    name = f"{engines.engine_class(result.engine).display_name} {result.version}"
    fmt = f" ({result.log_format})" if result.log_format and result.log_format != "unknown" else ""
    console.print(
        f"[bold]{escape(source)}[/]: {name} log{fmt}; {escape(s.model)} on {s.num_gpus}x {escape(s.gpu)} "
        f"(TP {s.tensor_parallel_size}, PP {s.pipeline_parallel_size}); max-model-len "
        f"{s.max_model_len:,}; KV {s.kv_cache_dtype}; block size {s.block_size}",
        highlight=False,
    )
    console.print()
    for title, rows in (
        ("kvplan's prediction (its own estimate of the non-KV memory) vs the log, per GPU", result.rows),
        ("kvplan's arithmetic given the log's KV memory", result.arithmetic_rows),
    ):
        if not rows:
            continue
        # under 110 columns the causes go below the table, one line each, so no flag or figure is cut
        # (issue 24); wider, they are the table's last column
        below = console.width < 110
        t = _table(title, "", "log", "kvplan", "difference", *([] if below else ["likely cause"]))
        if not below:
            t.columns[4].no_wrap = False
            t.columns[4].justify = "left"
            t.columns[4].overflow = "fold"
        for r in rows:
            d = r.difference
            t.add_row(
                r.quantity,
                _cell(r.unit, r.log),
                _cell(r.unit, r.kvplan),
                "-" if d is None else f"{d:+.1%}",
                *([] if below else [r.cause]),
            )
        console.print(t)
        if below:
            for r in rows:
                if r.cause:
                    console.print(f"- {r.quantity}: {r.cause}", highlight=False, markup=False)
        console.print()
    for note in result.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    if (
        result.measured_reserve_bytes is not None and result.measured_reserve_bytes >= 0
    ):  # a note says why not
        if saved:
            console.print(
                f"saved: {fmt_gib(result.measured_reserve_bytes)} of measured non-KV memory per GPU to {escape(str(saved))}; "
                "`kvplan estimate` uses it for this model, GPU, engine and layout",
                highlight=False,
            )
        else:
            console.print(
                f"measured non-KV memory: {fmt_gib(result.measured_reserve_bytes)} per GPU; "
                f"add --save-calibration to use it in later estimates",
                highlight=False,
            )


def speed_source(answers) -> str:
    """Where the solve table's TPOT comes from."""
    from kvplan.speed.step_model import is_measured

    labels = sorted({v for a in answers for v in a.plan.decode.batch_1.sources.values() if is_measured(v)})
    return "terms fitted to published runs" + "".join(f"; some {label}" for label in labels)


def _parallel_label(ep: int, dpa: int) -> str:
    """The second line of a layout cell: EP and DP attention (DPA alone when the experts stay TP-sliced)."""
    if ep > 1:
        return f"\nEP {ep}, DPA {dpa}"
    return f"\nDPA {dpa}" if dpa > 1 else ""


def _indented(console: Console, text: str) -> None:
    """Prose under an answer, wrapped to the terminal and indented 4 columns on every line (a launch line
    is kept whole instead, to be copied)."""
    lines = textwrap.wrap(text, max(console.width, 40) - 4, break_long_words=False, break_on_hyphens=False)
    for line in lines:
        console.print("    " + escape(line), highlight=False, soft_wrap=True)


def _launch_lines(console: Console, i: int, a, sg: str) -> None:
    """An answer's launch lines (those of the engines it has one for) and why it is expert-parallel."""
    lines = []
    if a.vllm_flags:
        lines.append(f"vLLM:   {escape(a.vllm_flags)}")
    if a.sglang_flags:
        lines.append(f"SGLang: {escape(a.sglang_flags + sg)}")
    elif a.sglang_refused:
        lines.append(f"SGLang: none (under SGLang's accounting: {escape(a.sglang_refused)})")
    for j, line in enumerate(lines):
        console.print((f"[bold]#{i}[/] " if j == 0 else "    ") + line, highlight=False, soft_wrap=True)
    if a.why_expert_parallel:
        _indented(console, f"why EP: {a.why_expert_parallel}")


def render_solve(q, answers, console: Console, max_context: bool) -> None:
    targets = [plural(q.users, "user")]
    if q.max_model_len:
        targets.append(f"{q.max_model_len:,} tokens each")
    if q.tpot_ms:
        targets.append(f"TPOT <= {q.tpot_ms:g} ms")
    where = (
        f"on {q.fixed_num_gpus}x {q.gpus[0].name}"
        if max_context
        else f"on up to {q.max_gpus} " + "/".join(g.name for g in q.gpus)
    )
    what = (
        "the longest context"
        if max_context
        else "the fewest GPUs"
        if not q.prices
        else "the cheapest layouts"
    )
    console.print(
        f"[bold]{escape(q.model.name)}[/]: {what} for {', '.join(targets)} {escape(where)}", highlight=False
    )
    cols = ["#", "GPUs", "TP x PP x DP", "KV dtype", "context", "max users", "users margin", "TPOT at load"]
    if q.tpot_ms:
        cols.append("TPOT margin")
    if q.prices:
        cols.append("cost/hour *")
    rows = []
    for i, a in enumerate(answers, 1):
        row = [
            str(i),
            f"{a.num_gpus}x {a.gpu}",
            f"{a.tensor_parallel_size} x {a.pipeline_parallel_size} x {a.data_parallel_size}"
            + _parallel_label(a.expert_parallel_size, a.attention_dp_size),
            a.kv_cache_dtype,
            f"{a.max_model_len:,}",
            f"{a.max_concurrency:,}",
            f"{a.margins.users:+.0%}",
            f"{a.tpot_ms:,.1f} ms",
        ]
        if q.tpot_ms:
            row.append(f"{a.margins.tpot or 0:+.0%}")
        if q.prices:
            row.append(f"{a.cost_per_hour:,.2f}")
        rows.append(row)
    # at a narrow terminal the margins go first (max users and TPOT stay), then the context when it
    # is the one asked for (cells are never cut)
    drop = [6, 8] if q.tpot_ms else [6]
    if not max_context:
        drop.append(4)
    for t in stacked_tables("", cols, rows, console.width, drop_order=drop, left=(0,)):
        console.print(t)
    if q.prices:
        console.print("* cost per hour: price per GPU-hour x GPUs, in the unit of --price", highlight=False)
    if any(a.expert_parallel_size > 1 or a.attention_dp_size > 1 for a in answers):
        console.print(
            "EP: GPUs the routed experts are spread over; DPA: attention data-parallel ranks, each with its "
            "own requests and KV; DP: deployments of that layout",
            highlight=False,
        )
    console.print()
    for i, a in enumerate(answers, 1):
        sg = (
            f" (SGLang's accounting holds {plural(a.sglang_max_concurrency, 'user')})"
            if a.sglang_max_concurrency is not None and a.sglang_max_concurrency != a.max_concurrency
            else ""
        )
        _launch_lines(console, i, a, sg)
        if a.why_pipeline:
            _indented(console, f"why PP: {a.why_pipeline}")
    console.print()
    at = (
        f"each request at {answers[0].tpot_context_source}"
        if q.has_workload
        else "every request at the full context"
    )
    margin = "; users margin: max users / users - 1"
    spec = answers[0].speculative
    what = (
        f"speculative decoding ({spec.method}): the verify step over {spec.verify_tokens} tokens a request "
        f"plus {spec.draft_steps} draft pass(es), over {spec.acceptance_length:g} tokens accepted a step "
        f"({spec.acceptance_source})"
        if spec is not None
        else "decode step"
    )
    console.print(
        f"TPOT: {what} with {at}, from kvplan's step model ({speed_source(answers)}){margin}",
        highlight=False,
    )
    held = answers[0].plan.decode.held_out
    if held is not None:
        console.print(f"#1's TPOT {held.tpot_line()}", highlight=False, markup=False)


def render_profile(prof, path, console: Console) -> None:
    label = "CPU profile" if prof.device == "cpu" else prof.device_name
    if prof.points:
        _render_kernel(prof, label, console)
    if prof.gemm:
        _render_gemm(prof, label, console)
    for a in prof.allreduce:
        console.print(
            f"all-reduce ({a.backend}, {a.world_size} ranks on {a.nodes} node{'s' if a.nodes > 1 else ''}, "
            f"{len(a.points)} sizes {fmt_bytes(a.points[0].bytes)}..{fmt_bytes(a.points[-1].bytes)}): "
            f"{a.latency_seconds * 1e6:,.1f} us + bytes / {a.bytes_per_s / 1e9:,.2f} GB/s "
            f"(bus {a.bus_bytes_per_s / 1e9:,.2f} GB/s); rms error {a.rms_relative_error:.1%}",
            highlight=False,
        )
    if prof.launch:
        graph = prof.launch.graph_seconds
        console.print(
            f"launch floor: {prof.launch.seconds * 1e6:,.2f} us per kernel eager"
            + (f", {graph * 1e6:,.2f} us in a CUDA graph" if graph else ""),
            highlight=False,
        )
    for n in prof.notes:
        console.print(f"- {n}", highlight=False, markup=False)
    console.print(f"saved {path}", highlight=False, markup=False)


def _render_kernel(prof, label: str, console: Console) -> None:
    t = _table(
        f"Decode kernel on {label} ({'quick' if prof.quick else 'full'} sweep)",
        "KV",
        "batch",
        "context",
        "bytes read",
        "time",
        "bandwidth",
    )
    for p in prof.points:
        t.add_row(
            p.kv_dtype,
            f"{p.batch:,}",
            f"{p.context:,}",
            fmt_bytes(p.bytes),
            f"{p.seconds * 1e3:,.3f} ms",
            f"{p.bytes_per_s / 1e9:,.1f} GB/s",
        )
    console.print(t)
    c = prof.ceilings
    if c:
        console.print(
            f"ceilings: copy {c['copy_bytes_per_s'] / 1e9:,.1f} GB/s (read + write), "
            f"read-only stream {c['read_bytes_per_s'] / 1e9:,.1f} GB/s",
            highlight=False,
        )
    sheet = f" (datasheet {prof.datasheet_bytes_per_s / 1e9:,.0f} GB/s)" if prof.datasheet_bytes_per_s else ""
    widths: list[tuple[int | None, Any]] = [
        (bits, prof.fit_for(bits)) for bits in (16, 8) if prof.points_of_width(bits)
    ]
    for bits, f in widths or [(None, prof.fit)]:
        label = f"fit ({bits}-bit KV)" if len(widths) > 1 else "fit"
        console.print(
            f"{label}: bandwidth(B) = {f.peak_bytes_per_s / 1e9:,.1f} GB/s x B / (B + {fmt_bytes(f.half_bytes)})"
            f"{sheet}; rms error {f.rms_relative_error:.1%}",
            highlight=False,
        )


def _gbps(bytes_per_s: float) -> str:
    gb = bytes_per_s / 1e9
    return f"{gb:,.0f}" if gb >= 100 else f"{gb:.3g}"


def _render_gemm(prof, label: str, console: Console) -> None:
    """One row per (dtype, K x N): weight GB/s at each measured batch."""
    batches = sorted({p.batch for p in prof.gemm})
    t = _table(f"Decode GEMMs on {label}: weight GB/s by batch", "dtype", "K x N", *map(str, batches))
    rows: dict[tuple[str, int, int], dict[int, float]] = {}
    for p in prof.gemm:
        rows.setdefault((p.dtype, p.k, p.n), {})[p.batch] = p.weight_bytes_per_s
    for (dtype, k, n), by_batch in rows.items():
        t.add_row(dtype, f"{k}x{n}", *(_gbps(by_batch[b]) if b in by_batch else "-" for b in batches))
    console.print(t)


def render_solve_load(ans: Any, console: Console) -> None:
    """`solve --request-rate` / `--max-rate`: the answer, its simulated percentiles and goodput."""
    a, t, r = ans.layout, ans.targets, ans.result
    p = t.percentile
    if ans.mode == "max-rate":
        head = f"the highest request rate on {a.num_gpus}x {a.gpu}: {ans.request_rate:,.3g} requests/s"
    else:
        what = "the cheapest GPUs" if a.cost_per_hour is not None else "the fewest GPUs"
        head = f"{what} for {ans.request_rate:g} requests/s: {a.num_gpus}x {a.gpu}"
    console.print(
        f"[bold]{escape(r.deployment['model'])}[/]: {escape(head)} (TTFT p{p} <= {t.ttft_ms:g} ms, "
        f"TPOT p{p} <= {t.tpot_ms:g} ms)",
        highlight=False,
    )
    unit = _parallel_label(a.expert_parallel_size, a.attention_dp_size).strip()
    console.print(
        f"layout: TP {a.tensor_parallel_size} x PP {a.pipeline_parallel_size} x DP {a.data_parallel_size} "
        + (f"deployments of {unit} " if unit else "")
        + f"({a.nodes} node{'s' if a.nodes > 1 else ''}), KV {a.kv_cache_dtype}, context {a.max_model_len:,}"
        + (f", {a.cost_per_hour:,.2f}/hour" if a.cost_per_hour is not None else ""),
        highlight=False,
    )
    if a.why_expert_parallel:
        console.print(f"why expert-parallel: {escape(a.why_expert_parallel)}", highlight=False)
    table = plain_table(f"one replica at {ans.per_replica_rate:.3g} req/s")
    for col in ("", "mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right" if col else "left")
    for name, s in (("TTFT (ms)", r.ttft_ms), ("TPOT (ms)", r.tpot_ms)):
        table.add_row(name, f"{s.mean:,.1f}", f"{s.median:,.1f}", f"{s.p90:,.1f}", f"{s.p99:,.1f}")
    console.print(table)
    console.print(
        f"goodput {ans.goodput:,.3g} requests/s of {ans.request_rate:,.3g} (all replicas); output "
        f"{r.output_token_throughput * a.data_parallel_size:,.0f} tokens/s; bounded by "
        f"{escape(ans.limited_by)}",
        highlight=False,
    )
    console.print(
        f"{ans.simulations} simulations in {ans.wall_s:.1f} s; workload: {escape(r.workload['description'])}",
        highlight=False,
    )
    if a.vllm_flags:
        console.print(f"vLLM:   {escape(a.vllm_flags)}", highlight=False, soft_wrap=True)
    if a.sglang_flags:
        console.print(f"SGLang: {escape(a.sglang_flags)}", highlight=False, soft_wrap=True)
    for note in r.assumptions:
        console.print(f"- {escape(note)}", highlight=False)


def render_solve_disaggregated(ans: Any, console: Console) -> None:
    """`solve --disaggregated --request-rate`: the prefill pool, the decode pool, the colocated answer."""
    t, pre, d = ans.targets, ans.prefill, ans.decode
    a, p = pre.layout, t.percentile
    console.print(
        f"[bold]{escape(pre.result.deployment['model'])}[/]: disaggregated prefill/decode for "
        f"{ans.request_rate:g} requests/s of {ans.input_tokens:,} in / {ans.output_tokens:,} out: "
        f"{ans.num_gpus} GPUs (TTFT p{p} <= {t.ttft_ms:g} ms, TPOT p{p} <= {t.tpot_ms:g} ms)",
        highlight=False,
    )
    table = plain_table("")
    for col in ("pool", "GPUs", "TP x PP x DP", "KV dtype", "what it reaches"):
        table.add_column(col, justify="left" if col in ("pool", "what it reaches") else "right")
    table.add_row(
        "prefill",
        f"{a.num_gpus}x {a.gpu}",
        f"{a.tensor_parallel_size} x {a.pipeline_parallel_size} x {a.data_parallel_size}"
        + _parallel_label(a.expert_parallel_size, a.attention_dp_size),
        a.kv_cache_dtype,
        f"TTFT p{p} {t.of(pre.result.ttft_ms):,.1f} ms + transfer {ans.transfer_ms:,.1f} ms = {ans.ttft_ms:,.1f} ms",
    )
    ep = _parallel_label(d.expert_parallel_size, d.attention_dp_size)
    table.add_row(
        "decode",
        f"{d.num_gpus}x {d.gpu}",
        f"{d.tensor_parallel_size} x {d.pipeline_parallel_size} x {d.data_parallel_size}{ep}",
        d.kv_cache_dtype,
        f"TPOT {d.tpot_ms:,.1f} ms at {d.concurrency_per_replica:,.1f} requests a replica",
    )
    console.print(table)
    if ans.colocated is not None:
        c = ans.colocated.layout
        console.print(
            f"colocated (solve --request-rate): {c.num_gpus}x {c.gpu} (TP {c.tensor_parallel_size} x PP "
            f"{c.pipeline_parallel_size} x DP {c.data_parallel_size}"
            f"{_parallel_label(c.expert_parallel_size, c.attention_dp_size).replace(chr(10), ', ')}), TTFT p{p} "
            f"{t.of(ans.colocated.result.ttft_ms):,.1f} ms, TPOT p{p} {t.of(ans.colocated.result.tpot_ms):,.1f} ms",
            highlight=False,
        )
    elif ans.colocated_verdict:
        console.print(f"colocated: no answer ({escape(ans.colocated_verdict)})", highlight=False)
    sglang = pre.result.deployment.get("engine") == "sglang"
    console.print(f"prefill: {escape((a.sglang_flags if sglang else a.vllm_flags) or '')}", highlight=False,
                  soft_wrap=True)  # fmt: skip
    console.print(f"decode:  {escape(d.launch)}", highlight=False, soft_wrap=True)
    for note in ans.assumptions:
        console.print(f"- {escape(note)}", highlight=False)


def render_disaggregated(r: Disaggregated, console: Console) -> None:
    """`estimate --disaggregated`: the two pools, the KV between them, the rates and which binds."""
    console.print(
        f"[bold]{escape(r.prefill_plan.model.name)}[/], disaggregated prefill/decode", highlight=False
    )
    console.print(
        f"{r.input_tokens:,} input + {r.output_tokens:,} output tokens a request",
        markup=False,
        highlight=False,
    )
    console.print()
    p, d = r.prefill, r.decode
    cells: list[tuple[str, str, str]] = []
    for pool in (p, d):
        name = "prefill" if pool is p else "decode"
        cells.append((
            f"{name} pool",
            f"{pool.gpus}",
            f"{pool.replicas} replica(s) of TP {pool.tensor_parallel_size} x PP {pool.pipeline_parallel_size}",
        ))  # fmt: skip
    cells += [
        ("KV per token moved", f"{r.kv_bytes_per_token:,.0f} bytes", r.kv_bytes_per_token_source),
        ("KV moved per request", fmt_bytes(r.kv_bytes_per_request), "input tokens x KV per token moved"),
        (
            "link, prefill -> decode",
            f"{r.link_bytes_per_s / 1e9:,.1f} GB/s",
            f"--network {r.network} per GPU x {r.link_gpus} GPU(s) of a prefill "
            + (
                f"replica's attention-DP rank ({r.link_source})"
                if r.attention_ranks > 1
                else f"replica ({r.link_source})"
            ),
        ),
        ("KV transfer per request", f"{r.transfer_ms:,.2f} ms", "KV moved / link"),
        (
            "links alone sustain",
            f"{r.transfer_requests_per_s:,.1f} req/s",
            f"{p.replicas} replica(s)"
            + (f" x {r.attention_ranks} attention-DP ranks" if r.attention_ranks > 1 else "")
            + " / transfer",
        ),
        ("prefill of one prompt", f"{p.prefill_ms:,.2f} ms", f"{r.input_tokens:,} tokens, bare forward pass"),
        ("prefill pool sustains", f"{p.requests_per_s:,.2f} req/s", f"{p.replicas} replica(s) / prefill"),
        (
            "decode concurrency",
            f"{d.concurrency:,} requests",
            f"{d.concurrency_per_replica:,} a replica at {d.context_tokens:,} tokens each",
        ),
        (
            "decode step" if d.speculative is None else "decode, per token",
            f"{d.step_ms:,.2f} ms",
            f"batch {d.concurrency_per_replica:,} at {d.step_context_tokens:,} tokens"
            + ("" if d.speculative is None else f"; speculative ({d.speculative})"),
        ),
        (
            "decode pool sustains",
            f"{d.requests_per_s:,.2f} req/s",
            f"concurrency / ({r.output_tokens:,} tokens x step)",
        ),
        (
            "prefill / decode rate",
            f"{r.prefill_to_decode_ratio:,.2f}",
            f"{r.binding_words} binds at {r.requests_per_s:,.2f} req/s",
        ),
    ]
    # the label and the value are never cut; the explanation wraps (issue 24: no number cut at 80 columns)
    rows = plain_table("Disaggregated prefill/decode")
    rows.add_column("", justify="left", no_wrap=True, min_width=max(len(c[0]) for c in cells))
    rows.add_column("value", justify="right", no_wrap=True, min_width=max(len(c[1]) for c in cells))
    rows.add_column("rests on", justify="left", overflow="fold", ratio=1)
    for cell in cells:
        rows.add_row(*cell)
    console.print(rows)
    console.print()
    console.print("[bold]Assumptions[/]")
    for note in r.assumptions:
        console.print(f"- {note}", markup=False)
