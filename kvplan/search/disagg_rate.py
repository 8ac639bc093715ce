"""`solve --disaggregated --request-rate R --ttft-ms T --tpot-ms P` (issue 23): the fewest GPUs for a
request rate as a prefill pool and a decode pool, and the colocated answer beside it.

  prefill pool  simulated (kvplan.simulator, as `solve --request-rate` runs it): the workload's prompts,
                each producing its first token only (a prefill instance's work: queueing, batching and
                chunking as the engine schedules them), the cheapest replicas of a layout whose TTFT at
                the percentile plus the KV transfer stays within --ttft-ms
  transfer      a request's KV (input x the model's KV bytes per token) over --network from its prefill
                replica's GPUs (one link per GPU, as `estimate --disaggregated`)
  decode pool   its steady state by Little's law: N requests decoding on a replica receiving R / DP
                requests/s satisfy N = R / DP x output x TPOT(N); TPOT(N) is the decode step at N requests,
                each at the mean context of its decode (input + output / 2), with no prefill in its steps
                (the prefill pool does that); the fewest replicas with N within the KV the replica holds at
                input + output tokens and TPOT(N) within --tpot-ms
The decode pool is computed, not simulated: a pure decode step is the same for every request in it, and
the batch varies around N (stated in the output).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from kvplan.errors import InfeasibleError, KvplanError, NoAnswer
from kvplan.model.parallel import DEFAULT_NETWORK
from kvplan.plan.disagg import kv_transfer_seconds
from kvplan.plan.plan import Plan, estimate
from kvplan.request import Speculative
from kvplan.search import rate
from kvplan.search.solve import (
    SGLANG_KV_DTYPE,
    Parallel,
    Query,
    _batch,
    _cost,
    _label,
    _max_dp,
    _request,
    launch_line,
    partial_nodes,
    rented,
    shapes,
    speculative_flags,
    unit_gpus,
)
from kvplan.simulator import Workload
from kvplan.speed import plan_speed
from kvplan.speed.prefill import prefill_caveat

SCHEMA = "kvplan.solve-disaggregated/1"
PREFILL_TPOT_MS = rate.NO_TPOT_MS  # a prefill instance emits one token: no TPOT target applies to it


@dataclass(frozen=True)
class DecodePool:
    gpu: str
    num_gpus: int
    nodes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    kv_cache_dtype: str
    requests_per_s_per_replica: float
    concurrency_per_replica: float  # N, by Little's law
    capacity_per_replica: int  # requests the replica holds at input + output tokens
    step_context_tokens: int
    tpot_ms: float  # the decode step at N requests
    launch: str  # one deployment's command for the searched engine (the KV connector not included)
    expert_parallel_size: int = 1  # an MoE model's expert-parallel unit: GPUs its experts spread over
    attention_dp_size: int = 1  # and its attention-DP ranks, each with its own requests and KV


@dataclass
class DisaggregatedAnswer:
    request_rate: float
    input_tokens: int
    output_tokens: int
    targets: rate.LoadTargets
    prefill: rate.RateAnswer  # the prefill pool (its TTFT excludes the transfer)
    transfer_ms: float
    ttft_ms: float  # the prefill pool's TTFT at the percentile + the transfer
    decode: DecodePool
    num_gpus: int
    colocated: rate.RateAnswer | None  # `solve --request-rate` on the same workload
    colocated_verdict: str | None  # why there is none
    assumptions: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        d, p = self.decode, self.prefill.layout
        return (
            f"disaggregated at {self.request_rate:g} requests/s: {self.num_gpus} GPUs = prefill {p.num_gpus}x "
            f"{p.gpu} (TP {p.tensor_parallel_size} x DP {p.data_parallel_size}) + decode {d.num_gpus}x {d.gpu} "
            f"(TP {d.tensor_parallel_size} x DP {d.data_parallel_size}); TTFT p{self.targets.percentile} "
            f"{self.ttft_ms:,.0f} ms, TPOT {d.tpot_ms:,.1f} ms"
            + (f"; colocated {self.colocated.layout.num_gpus} GPUs" if self.colocated else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "request_rate": self.request_rate,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "targets": self.targets.to_dict(),
            "num_gpus": self.num_gpus,
            "prefill": self.prefill.to_dict(),
            "transfer_ms": self.transfer_ms,
            "ttft_ms": self.ttft_ms,
            "decode": dataclasses.asdict(self.decode),
            "colocated": self.colocated.to_dict() if self.colocated else None,
            "colocated_verdict": self.colocated_verdict,
            "assumptions": list(self.assumptions),
            "chart": None,  # the file --plot wrote (the command line fills it in)
        }


def _means(workload: Workload) -> tuple[int, int]:
    reqs = workload.requests
    return (
        round(sum(r.prompt_tokens for r in reqs) / len(reqs)),
        max(1, round(sum(r.output_tokens for r in reqs) / len(reqs))),
    )


def _first_tokens(workload: Workload) -> Workload:
    """The workload as a prefill instance sees it: every request producing its first token only."""
    reqs = tuple(dataclasses.replace(r, output_tokens=1) for r in workload.requests)
    return Workload(
        reqs, workload.max_concurrency, f"{workload.description}, first tokens only (prefill pool)"
    )


def _transfer_ms(plan: Plan, inp: int, q: Query) -> float:
    return kv_transfer_seconds(plan, inp, q.network or DEFAULT_NETWORK) * 1e3


def _little(
    plan: Plan,
    per_replica: float,
    out: int,
    cap: int,
    ctx: int,
    kv: float,
    batch_of: Any = None,
    spec: Speculative | None = None,
) -> tuple[float, float] | None:
    """(N, TPOT ms) of a decode replica receiving `per_replica` requests/s, or None when no N <= cap
    keeps up (the replica's throughput at its capacity is below the arrivals). `batch_of(n)`: the batch
    the step model takes for n requests on the replica (vLLM's DP ranks: n / DP each). Under
    speculative decoding TPOT is the draft + verify step over the tokens kept a step (spec_step)."""

    def tpot(n: int) -> float:
        b = max(1, n) if batch_of is None else max(1, batch_of(max(1, n)))
        if spec is not None:
            return plan_speed.spec_step(plan.decode.inputs, spec, b, kv, ctx, plan.decode.parts).tpot_ms
        return plan.decode.step(b, kv, ctx).tpot_ms

    def short(n: int) -> bool:  # fewer decoding than arrivals keep busy: the steady state lies above
        return n < per_replica * out * tpot(n) / 1e3

    if short(cap):
        return None
    lo, hi = 0, cap  # short(lo) or lo == 0; not short(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if short(mid):
            lo = mid
        else:
            hi = mid
    n = max(per_replica * out * tpot(hi) / 1e3, 1e-9)
    return n, tpot(math.ceil(n))


def _decode_flags(q: Query, tp: int, pp: int, par: Parallel, deployments: int, plan: Plan, dtype: str,
                  cap: int) -> str:  # fmt: skip
    """One decode deployment's launch line for the searched engine (the KV connector not included)."""
    kv = SGLANG_KV_DTYPE.get(dtype, dtype) if q.engine == "sglang" else dtype
    return launch_line(q.engine, q.model.hf_id or q.model.name, tp, pp, deployments, par,
                       plan.settings.max_model_len, [f"--kv-cache-dtype {kv}", *speculative_flags(q.engine, q.speculative)],
                       cap, q.model.moe is not None)  # fmt: skip


def _decode_pool(q: Query, req_rate: float, inp: int, out: int, tpot_target: float) -> DecodePool:
    """The cheapest decode pool (replicas of a TP x PP layout, or for an MoE model of an expert-parallel
    unit with DP attention) keeping up with `req_rate` within the TPOT target."""
    best: tuple[tuple, DecodePool] | None = None
    reasons: list[str] = []
    closest: tuple[float, str] | None = None  # the fastest TPOT a layout that holds the weights reached
    length = q.max_model_len or q.model.max_context
    for gpu in q.gpus:
        for dtype in q.kv_dtypes:
            for tp, pp, par in shapes(q, gpu, dtype):
                unit = unit_gpus(q, tp, pp, par)
                try:
                    # capacity at a request's final context; the step at the mean context of its decode
                    req = dataclasses.replace(
                        _request(q, gpu, tp, pp, dtype, length, par),
                        avg_context_tokens=min(inp + out, length),
                        input_len=min(inp, length - 1),
                        output_len=max(1, min(out, length - inp)),
                    )
                    plan = estimate(req)
                except InfeasibleError as exc:
                    reasons.append(f"{gpu.name} {_label(q, tp, pp, par)} ({dtype}): {exc}")
                    continue
                assert plan.avg_context is not None
                cap = plan.avg_context.max_concurrency_per_replica
                cap *= plan.cluster.data_parallel_size  # vLLM's DP engine cores of one unit
                if cap < 1:
                    continue
                ctx = plan.decode.context_tokens
                kv = plan.decode.kv_bytes_per_request_per_gpu

                def batch_of(n: int, par: Parallel = par) -> int:
                    return _batch(q, par, n)

                for dp in range(1, _max_dp(q, gpu, unit) + 1):
                    got = _little(plan, req_rate / dp, out, cap, ctx, kv, batch_of, q.speculative)
                    if got is not None and got[1] > tpot_target and (closest is None or got[1] < closest[0]):
                        closest = (
                            got[1],
                            f"{unit * dp} {gpu.name} as {_label(q, tp, pp, par)} x DP {dp} ({dtype})",
                        )
                    if got is None or got[1] > tpot_target:
                        continue
                    dp2, n, nodes = rented(q, gpu, unit, dp)
                    if dp2 != dp:
                        got = _little(plan, req_rate / dp2, out, cap, ctx, kv, batch_of, q.speculative) or got
                    # as the colocated search ranks (rate.py): GPUs (or cost), plain TP before an expert-parallel
                    # unit, then full-precision KV before fp8
                    key = (_cost(q, gpu, n), n, par.on, q.kv_dtypes.index(dtype), pp, tp)
                    if best is None or key < best[0]:
                        flags = _decode_flags(q, tp, pp, par, dp2, plan, dtype, cap)
                        pool = DecodePool(
                            gpu.name, n, nodes, tp, pp, dp2, dtype, req_rate / dp2, got[0], cap, ctx, got[1],
                            flags, par.ep, par.dp,
                        )  # fmt: skip
                        best = (key, pool)
                    break
    if best is None:
        why = (
            f"the fastest that holds the weights, {closest[1]}, reaches TPOT {closest[0]:,.1f} ms"
            if closest is not None
            else "; ".join(reasons[:2])
        )
        raise NoAnswer(
            f"no decode pool within --max-gpus {q.max_gpus} keeps up with {req_rate:g} requests/s of "
            f"{out:,} output tokens within --tpot-ms {tpot_target:g}" + (f" ({why})" if why else "")
        )
    return best[1]


def solve_disaggregated(
    q: Query, workload: Workload, targets: rate.LoadTargets, req_rate: float, colocated: bool = True
) -> DisaggregatedAnswer:
    rate.check_lengths(q, workload)
    inp, out = _means(workload)
    decode = _decode_pool(q, req_rate, inp, out, targets.tpot_ms)
    first = _first_tokens(workload)
    pre_targets = rate.LoadTargets(targets.ttft_ms, PREFILL_TPOT_MS, targets.percentile)
    left = q.max_gpus - decode.num_gpus  # --max-gpus bounds both pools together
    # the node rule is the user's query's, the same for both pools: a prefill pool's share below a node does
    # not turn partial nodes on for that pool alone
    whole = not any(partial_nodes(q, g) for g in q.gpus)
    if left < 1 or (whole and left < min(g.gpus_per_node for g in q.gpus)):
        rounded = " (whole nodes; --partial-nodes rents part of one)" if whole else ""
        raise NoAnswer(
            f"--max-gpus {q.max_gpus}: the decode pool alone takes {decode.num_gpus} {decode.gpu}{rounded} "
            f"({req_rate:g} requests/s of {out:,} output tokens within --tpot-ms {targets.tpot_ms:g}), "
            f"leaving {'none' if left < 1 else f'{left}, under a node,'} for the prefill pool; allow more GPUs"
            + (" or give --partial-nodes" if whole else "")
        )
    # the pools hold the KV in one dtype: the connectors move pages as they are (vLLM's NixlConnector refuses a
    # peer whose cache dtype differs, kv_connector/v1/nixl_connector.py compute_nixl_compatibility_hash)
    user_max, asked = q.max_gpus, q
    q = dataclasses.replace(q, max_gpus=left, kv_dtypes=(decode.kv_cache_dtype,), whole_nodes=whole)
    try:
        prefill = rate.min_gpus_at_rate(q, first, pre_targets, req_rate)
    except NoAnswer as exc:  # said in the user's terms: their targets and budget, what the decode pool took
        p = targets.percentile
        got = exc.figures.get(f"ttft_p{p}_ms")
        if got is None:  # a verdict of its own (one prompt alone misses --ttft-ms): it names the user's flag
            raise
        raise NoAnswer(
            f"at {req_rate:g} requests/s the decode pool within --tpot-ms {targets.tpot_ms:g} takes "
            f"{decode.num_gpus} {decode.gpu}, leaving {left} of --max-gpus {user_max} for the prefill pool, where "
            + f"the most replicas reach TTFT p{p} {got:,.0f} ms against --ttft-ms {targets.ttft_ms:g}; allow more "
            "GPUs or relax the targets"
        ) from None
    transfer = _transfer_ms(prefill.layout.plan, inp, q)
    ttft = pre_targets.of(prefill.result.ttft_ms) + transfer
    if ttft > targets.ttft_ms:  # the transfer does not fit beside that pool's TTFT: leave it room
        budget = targets.ttft_ms - transfer
        if budget <= 0:
            raise NoAnswer(
                f"--ttft-ms {targets.ttft_ms:g}: moving a request's KV alone takes {transfer:,.1f} ms over the "
                "network between the pools; relax the target or use a faster --network"
            )
        prefill = rate.min_gpus_at_rate(
            q, first, rate.LoadTargets(budget, PREFILL_TPOT_MS, targets.percentile), req_rate
        )
        transfer = _transfer_ms(prefill.layout.plan, inp, q)
        ttft = pre_targets.of(prefill.result.ttft_ms) + transfer
        if ttft > targets.ttft_ms:  # that pool's replicas are narrower: their transfer takes longer
            raise NoAnswer(
                f"--ttft-ms {targets.ttft_ms:g}: the prefill pool that meets it before the transfer "
                f"({prefill.layout.num_gpus}x {prefill.layout.gpu}) reaches {ttft:,.1f} ms with its "
                f"{transfer:,.1f} ms transfer; relax the target or use a faster --network"
            )
    together, verdict = None, None
    if colocated:
        try:
            # the user's own question (every KV dtype, the node rule asked), not the pools' narrowed one
            together = rate.min_gpus_at_rate(asked, workload, targets, req_rate)
        except KvplanError as exc:
            verdict = str(exc).splitlines()[0]
    net = q.network or DEFAULT_NETWORK
    notes = [
        f"prefill pool simulated on the workload's prompts, each producing its first token only "
        f"({prefill.simulations} simulations); its TTFT excludes the transfer",
        f"transfer: a request's {inp:,} input tokens of KV over {net.name} ({net.bytes_per_s / 1e9:g} GB/s per "
        f"GPU, {'assumed, the default' if q.network is None else '--network'}) from its prefill replica's "
        f"{prefill.layout.tensor_parallel_size * prefill.layout.pipeline_parallel_size} GPU(s); latency and "
        "overlap with compute not counted",
        f"decode pool by Little's law, not simulated: {decode.concurrency_per_replica:,.1f} requests decoding on "
        f"each replica (of {decode.capacity_per_replica:,} it holds at {inp + out:,} tokens), every one at "
        f"the mean context {decode.step_context_tokens:,}; a pure decode step is the same for every request "
        "in it, so its TPOT is that step at every percentile (the batch varies around N)",
        f"lengths: the workload's means, {inp:,} in / {out:,} out",
        *(
            [
                f"decode TPOT under speculative decoding ({q.speculative.method}): the draft passes and the verify "
                f"step over {q.speculative.verify_tokens} tokens a request, / {q.speculative.acceptance_length:.2f} "
                f"tokens kept a step ({q.speculative.acceptance_source})"
            ]
            if q.speculative is not None
            else []
        ),
        "the launch lines omit the KV connector each engine's disaggregated mode needs (vLLM "
        "--kv-transfer-config, SGLang --disaggregation-mode prefill/decode)",
    ]
    caveat = prefill_caveat(prefill.layout.plan.decode.inputs.kind, "the prefill pool's TTFT and size are")
    if caveat:
        notes.append(f"prefill: {caveat}")
    return DisaggregatedAnswer(
        req_rate, inp, out, targets, prefill, transfer, ttft, decode,
        prefill.layout.num_gpus + decode.num_gpus, together, verdict, notes,
    )  # fmt: skip
