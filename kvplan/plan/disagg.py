"""Disaggregated prefill/decode (issue 23): a prefill pool and a decode pool, each planned as a normal
deployment of its own GPUs, and the KV cache each request moves from one to the other.

  KV moved      input tokens x the KV bytes per token the replica's GPUs hold, summed over them: each GPU
                sends its own shard, so KV heads replicated over TP ranks (TP > KV heads) and MLA's
                latent (whole on every TP rank) are sent once per copy (bytes a request)
  transfer      KV moved / (the --network link per GPU x one prefill replica's GPUs): a request's KV
                leaves the replica that computed it, each GPU its own shard over its own link;
                the pool's replicas send side by side (transfer_requests_per_s)
  prefill rate  replicas / one --input-len prompt's bare prefill (prefill_time, served=False)
  decode rate   requests the pool holds at input + output tokens / (output tokens x the decode step
                at that batch, each request at the mean context of its decode, input + output / 2)
The smaller rate binds; their ratio says by how much. Pure arithmetic on two plans: no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from kvplan.errors import KvplanError, RequestDoesNotFit, UsageError
from kvplan.model.parallel import DEFAULT_NETWORK, Network
from kvplan.plan.plan import Plan, PlanRequest, estimate
from kvplan.speed.plan_speed import NETWORK_UNUSED
from kvplan.speed.prefill import prefill_caveat, prefill_time


@dataclass(frozen=True)
class PrefillPool:
    gpus: str  # as given, e.g. 4xH100
    num_gpus: int
    replicas: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    prefill_ms: float  # one --input-len prompt, bare forward pass (no serving overhead), one replica
    requests_per_s: float  # replicas / prefill_ms


@dataclass(frozen=True)
class DecodePool:
    gpus: str
    num_gpus: int
    replicas: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    context_tokens: int  # input + output: what a request holds at its end
    concurrency_per_replica: int  # requests that fit at context_tokens (capped as the engine caps)
    concurrency: int  # all replicas
    step_context_tokens: int  # the mean context of a decode, input + output / 2
    step_ms: float  # time per output token at concurrency_per_replica requests: one decode step, or under
    # speculative decoding the draft + verify step over the tokens kept a step (plan_speed.spec_step)
    requests_per_s: float  # concurrency / (output tokens x step)
    speculative: str | None = None  # how a speculative step_ms was made, else None


@dataclass(frozen=True)
class Disaggregated:
    input_tokens: int
    output_tokens: int
    kv_bytes_per_token: float  # moved per token: the prefill replica's per-GPU KV summed over its GPUs
    kv_bytes_per_token_source: str  # how that relates to the model's own KV bytes per token
    kv_bytes_per_request: float  # input tokens x kv_bytes_per_token: what the prefill pool sends
    network: str
    link_bytes_per_s: float  # one GPU's link x one prefill replica's GPUs
    link_source: str  # --network as given, or the default (assumed)
    transfer_ms: float  # kv_bytes_per_request / link_bytes_per_s
    transfer_requests_per_s: float  # what the links alone sustain: replicas / transfer
    prefill: PrefillPool
    decode: DecodePool
    prefill_to_decode_ratio: float  # prefill rate / decode rate: < 1 prefill binds, > 1 decode binds
    # prefill, decode, or link: the KV transfers, when they carry fewer requests a second than either pool
    binding_pool: str
    requests_per_s: float  # the smallest of the three rates
    assumptions: list[str]
    prefill_plan: Plan
    decode_plan: Plan
    link_gpus: int = 1  # GPUs whose links carry one request's KV (request_gpus)
    attention_ranks: int = 1  # a prefill replica's attention-DP ranks, each sending its own requests

    def __repr__(self) -> str:
        p, d = self.prefill, self.decode
        return (
            f"Disaggregated({self.prefill_plan.model.name}: prefill {p.gpus}, decode {d.gpus}; "
            f"{self.input_tokens:,} in / {self.output_tokens:,} out; KV moved {self.kv_bytes_per_request / 1e9:,.2f} GB "
            f"a request in {self.transfer_ms:,.1f} ms; {self.binding_words} binds at {self.requests_per_s:,.2f} req/s)"
        )

    @property
    def binding_words(self) -> str:
        return "the KV link" if self.binding_pool == "link" else f"the {self.binding_pool} pool"

    def to_dict(self) -> dict[str, Any]:
        skip = ("prefill", "decode", "prefill_plan", "decode_plan")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        out["prefill"] = asdict(self.prefill)
        out["decode"] = asdict(self.decode)
        out["assumptions"] = list(self.assumptions)
        out["prefill_plan"] = self.prefill_plan.to_dict()
        out["decode_plan"] = self.decode_plan.to_dict()
        return {"disaggregated": out}  # the command's --json, one key (README, Disaggregated prefill/decode)


def request_gpus(prefill: Plan) -> int:
    """The GPUs holding one request's KV: its attention rank's (all of a replica's without DP attention)."""
    c = prefill.cluster
    return (c.attention_tp_size or c.tensor_parallel_size) * c.pipeline_parallel_size


def replica_link_bytes_per_s(prefill: Plan, net: Network) -> float:
    """What a request's KV leaves the prefill pool over: one --network link per GPU holding it (under DP
    attention one attention rank's; the other ranks send their own requests side by side)."""
    return net.bytes_per_s * request_gpus(prefill)


def kv_moved_bytes_per_token(plan: Plan) -> float:
    """KV bytes a token moves between the pools: what each GPU of one replica holds of it (every
    pipeline stage, each of a request's attention-TP ranks), summed. The engines' connectors send each
    rank's own KV pages (SGLang python/sglang/srt/disaggregation/mooncake/conn.py, send_kvcache per
    rank), so copies count: Mooncake's measurement of Qwen3-235B at TP 8 (4 KV heads, each held by two
    ranks) moves 12.62 GB for 32,768 tokens, twice the model's 6.31 GB (Mooncake docs,
    performance/sglang/sglang-benchmark-results-v1.md)."""
    ranks = plan.cluster.attention_tp_size or plan.cluster.tensor_parallel_size
    return sum(s.kv_bits_per_token_per_gpu for s in plan.stages) / 8 * ranks


def kv_moved_bytes(prefill: Plan, input_tokens: int) -> float:
    """A request's KV moved between the pools: its input tokens x kv_moved_bytes_per_token, and what it holds
    whatever its length (recurrent states, image K/V), which the decode side needs as much."""
    return input_tokens * kv_moved_bytes_per_token(prefill) + prefill.kv_bytes_per_request_fixed


def kv_transfer_seconds(prefill: Plan, input_tokens: int, net: Network) -> float:
    """A request's KV (kv_moved_bytes) moved from the prefill replica that computed it to the decode pool."""
    return kv_moved_bytes(prefill, input_tokens) / replica_link_bytes_per_s(prefill, net)


def _pool_plan(req: PlanRequest, pool: str, gpus: str) -> Plan:
    """One pool's plan; a refusal says which pool, and its layout flags in place of -tp/-pp."""
    try:
        plan = estimate(req)
    except KvplanError as exc:
        text = str(exc).replace("(-tp/-pp)", f"(--{pool}-gpus, --{pool}-tp)")
        raise type(exc)(f"the {pool} pool ({gpus}): {text}", **exc.figures) from None
    if req.network is None:
        return plan
    # the KV transfer between the pools crosses the fabric even where a pool's own links do not
    unused = NETWORK_UNUSED.format(name=req.network.name)
    return dataclasses.replace(plan, assumptions=[a for a in plan.assumptions if a != unused])


def disaggregate(
    prefill_req: PlanRequest, decode_req: PlanRequest, prefill_gpus: str, decode_gpus: str
) -> Disaggregated:
    """Plan both pools (the same flags, each its own GPUs) and the figures of the module docstring."""
    if prefill_req.input_len is None or prefill_req.output_len is None:
        raise UsageError("--disaggregated needs --input-len and --output-len (a request's prompt and output)")
    inp, out = prefill_req.input_len, prefill_req.output_len
    if out < 1:
        raise UsageError("--disaggregated needs --output-len >= 1")
    p = _pool_plan(prefill_req, "prefill", prefill_gpus)
    # the decode pool also reports its concurrency at a request's final context, input + output
    d = _pool_plan(dataclasses.replace(decode_req, avg_context_tokens=inp + out), "decode", decode_gpus)

    kv_token = kv_moved_bytes_per_token(p)
    copies = kv_token / p.kv_bytes_per_token if p.kv_bytes_per_token else 1.0
    kv_source = (
        "the model's KV per token, each GPU of a prefill replica sending its own shard"
        if abs(copies - 1) < 1e-9
        else f"{copies:g} x the model's {p.kv_bytes_per_token:,.0f} bytes: the KV is held {copies:g} times over "
        "a prefill replica's GPUs (KV heads or MLA's latent replicated over TP ranks), each GPU sending its copy"
    )
    kv_request = kv_moved_bytes(p, inp)
    fixed = p.kv_bytes_per_request_fixed
    net = prefill_req.network or DEFAULT_NETWORK
    ranks = max(1, p.cluster.attention_dp_size)
    link = replica_link_bytes_per_s(p, net)
    transfer_s = kv_transfer_seconds(p, inp, net)

    pt = prefill_time(p.decode.inputs, p.prefill.work, inp, 0, served=False)
    p_replicas = p.cluster.data_parallel_size
    prefill_rate = p_replicas / (pt.total_ms / 1e3)

    assert d.avg_context is not None  # set above
    held = d.avg_context.max_concurrency_per_replica
    # timed at the batch the scheduler forms: its running cap, a flag's or its default
    at = d.decode.at_avg_context
    conc = min(held, at.batch) if at is not None else held
    if conc < 1:
        raise RequestDoesNotFit(
            f"--decode-gpus {decode_gpus}: no request of {inp + out:,} tokens fits the decode pool",
            request_tokens=inp + out,
        )
    d_replicas = d.cluster.data_parallel_size
    step_ms = d.decode.step(conc, d.decode.kv_bytes_per_request_per_gpu, d.decode.context_tokens).tpot_ms
    spec_how = None
    if (
        decode_req.speculative is not None
    ):  # the decode pool runs the speculative step, as solve --disaggregated
        from kvplan.speed.plan_speed import spec_step

        sp = spec_step(d.decode.inputs, decode_req.speculative, conc, d.decode.kv_bytes_per_request_per_gpu,
                       d.decode.context_tokens, d.decode.parts)  # fmt: skip
        spec_how = (
            f"{sp.method}: verify {sp.verify_ms:,.2f} ms + draft {sp.draft_ms:,.2f} ms a step, / {sp.acceptance_length:.2f} "
            f"tokens kept ({sp.acceptance_source})"
        )
        step_ms = sp.tpot_ms
    decode_rate = conc * d_replicas / (out * step_ms / 1e3)
    ratio = prefill_rate / decode_rate
    how = "assumed, the default; set --network" if prefill_req.network is None else "--network"
    notes = [
        f"link between the pools: {net.name}, {net.what}, {net.bytes_per_s / 1e9:g} GB/s per GPU ({how}), "
        f"summed over the {request_gpus(p)} GPU(s) holding one request's KV"
        + (f" (one of a replica's {ranks} attention-DP ranks)" if ranks > 1 else " (one prefill replica's)")
        + ", the ranks and replicas sending side by side; its latency and any overlap with compute not counted",
        f"KV moved = --input-len {inp:,} x {kv_token:,.0f} bytes a token ({kv_source}; every layer, a "
        "sliding window's cap not applied)"
        + (
            f" + {fixed:,} bytes a request holds whatever its length (recurrent state, image K/V)"
            if fixed
            else ""
        ),
        "prefill rate: prompts one after another on each replica, a bare forward pass (prefill_fit.yaml; "
        "no serving overhead, no batching of prompts)"
        + (
            f"; under DP attention its {ranks} ranks prefill side by side, not counted: a floor"
            if ranks > 1
            else ""
        ),
        f"decode rate: the requests that fit at input + output = {inp + out:,} tokens each, stepping at the "
        f"mean context {d.decode.context_tokens:,} (decode_fit.yaml), each emitting {out:,} tokens",
    ]
    if conc < held:
        notes.append(
            f"decode concurrency {conc:,} a replica: the engine runs no more at once (--max-num-seqs / "
            f"--max-running-requests, or its default); memory holds {held:,} at {inp + out:,} tokens"
        )
    for pool, plan in (("prefill", p), ("decode", d)):  # the weights' copy over PCIe is in that pool's times
        notes += [f"{pool} pool: {a}" for a in plan.assumptions if a.startswith("--cpu-offload-gb")]
    caveat = prefill_caveat(p.decode.inputs.kind, "the prefill pool's rate is", rate=True)
    if caveat:
        notes.append(f"prefill: {caveat}")
    link_rate = p.cluster.data_parallel_size * ranks / transfer_s
    # every request's KV crosses the link: the deployment runs at the slowest of the three
    rate, binding = min((prefill_rate, "prefill"), (decode_rate, "decode"), (link_rate, "link"))
    return Disaggregated(
        input_tokens=inp,
        output_tokens=out,
        kv_bytes_per_token=kv_token,
        kv_bytes_per_token_source=kv_source,
        kv_bytes_per_request=kv_request,
        network=net.name,
        link_bytes_per_s=link,
        link_source=how,
        transfer_ms=transfer_s * 1e3,
        transfer_requests_per_s=link_rate,
        link_gpus=request_gpus(p),
        attention_ranks=ranks,
        prefill=PrefillPool(
            prefill_gpus,
            p.cluster.num_gpus,
            p_replicas,
            p.cluster.tensor_parallel_size,
            p.cluster.pipeline_parallel_size,
            pt.total_ms,
            prefill_rate,
        ),
        decode=DecodePool(
            decode_gpus,
            d.cluster.num_gpus,
            d_replicas,
            d.cluster.tensor_parallel_size,
            d.cluster.pipeline_parallel_size,
            inp + out,
            conc,
            conc * d_replicas,
            d.decode.context_tokens,
            step_ms,
            decode_rate,
            spec_how,
        ),
        prefill_to_decode_ratio=ratio,
        binding_pool=binding,
        requests_per_s=rate,
        assumptions=notes,
        prefill_plan=p,
        decode_plan=d,
    )
