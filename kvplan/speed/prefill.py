"""Prefill: what a prompt's tokens cost on one replica, term by term.

A prefill of `tokens` new tokens after `cached_tokens` already in the KV cache (a prefix hit, or the
earlier chunks of a chunked prefill), one GPU of each pipeline stage, stages one after another:
  GEMMs      2 x active params x tokens FLOPs over the TP group, at `gemm_mfu` of the dense peak of
             the weights' dtype; never faster than streaming every weight once (all routed experts:
             a prompt's tokens touch them all). The input embedding is a row gather, not a GEMM, and
             the LM head runs on each prompt's last token only (the engines compute logits at the
             sampled positions: vllm/v1/worker/gpu_model_runner.py v0.11.0, logits_indices; SGLang's
             srt/layers/logits_processor.py LogitsProcessor.forward, each extend's last hidden state
             unless prompt logprobs are asked for), so both are left
             out of the per-token FLOPs and the head is charged once per prompt
  attention  causal: 2 x 2 x tokens x (cached + tokens / 2) x attention layers x query width FLOPs
             (QK^T and PV), at `attention_mfu` of the bf16 dense peak (FlashAttention runs bf16)
  comm       two all-reduces of tokens x hidden x 2 bytes per layer under TP (the decode step's links);
             one activation hop per pipeline boundary
  MoE acts   the fused MoE's activation buffers per token-expert pair, each written and read once:
             gate_up's output, the activation's, and down's (tokens x top-k x hidden, summed per token
             by moe_sum): vllm/model_executor/layers/fused_moe/fused_moe.py (v0.11.0, fused_experts_impl:
             intermediate_cache1/2/3), at the weight stream's share of HBM bandwidth
Under DP attention a prompt's attention GEMMs and FLOPs run on one attention-DP rank (attn_tp GPUs) and
its attention output is all-reduced over them; under expert parallelism with an all-to-all, the MoE
layers dispatch and combine its tokens instead of all-reducing them.
  launch     the decode step's per-layer launch cost (decode_fit.yaml)
  MoE GEMMs  the routed experts' share of the GEMM FLOPs and of the weight stream run at `moe_gemm_eff`
             of a dense GEMM's rate: the fused MoE kernel runs one grouped GEMM over every expert at a
             few tokens each (vllm/model_executor/layers/fused_moe/fused_moe.py v0.11.0,
             invoke_fused_moe_kernel: each expert's tokens padded to BLOCK_SIZE_M by moe_align_block_size)
  overhead   what a served request's first token pays beyond the forward pass (scheduling,
             tokenisation, sampling, the HTTP round trip): `ttft_overhead_s`; 0 for an engine's own
             one-batch benchmark
The coefficients are fitted to published prefill times (benchmarks/fit_prefill.py) and read once
from kvplan/data/prefill_fit.yaml. Pure functions otherwise: no torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import yaml

from kvplan.speed.step_model import (
    Coefficients,
    DecodeInputs,
    _hop_seconds,
    all_to_all_seconds,
    allreduce_seconds,
    coefficients,
    moe_prefill_stream_seconds,
    offload_seconds,
)

FIT_FILE = "prefill_fit.yaml"
COEFFICIENTS = ("gemm_mfu", "attention_mfu", "ttft_overhead_s", "moe_gemm_eff")


@dataclass(frozen=True)
class PrefillCoefficients:
    gemm_mfu: float  # share of the dtype's dense FLOP/s a prefill GEMM reaches
    attention_mfu: float  # share of the bf16 dense FLOP/s causal prefill attention reaches
    ttft_overhead_s: float  # a served request's first token beyond the forward pass
    # share of a dense GEMM's rate (FLOPs and bytes) the routed experts' GEMMs reach
    moe_gemm_eff: float = 1.0
    sources: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> PrefillCoefficients:
        missing = [k for k in COEFFICIENTS if k not in data]
        if missing:
            raise ValueError(f"{FIT_FILE}: missing {', '.join(missing)}")
        values = {k: float(data[k]["value"]) for k in COEFFICIENTS}
        return PrefillCoefficients(**values, sources={k: str(data[k]["source"]) for k in COEFFICIENTS})

    def to_dict(self) -> dict[str, Any]:
        return {k: {"value": getattr(self, k), "source": self.sources.get(k, "")} for k in COEFFICIENTS}


@functools.cache
def _fit_file() -> dict[str, Any]:
    """kvplan/data/prefill_fit.yaml, read once."""
    text = resources.files("kvplan").joinpath("data").joinpath(FIT_FILE).read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


@functools.cache
def prefill_coefficients() -> PrefillCoefficients:
    """The shipped prefill coefficients (kvplan/data/prefill_fit.yaml)."""
    return PrefillCoefficients.from_dict(_fit_file()["coefficients"])


# written 2026-12-01 before the evidence was read per model kind: a kind whose published prefill times
# (prefill_fit.yaml `evidence`: at least CAVEAT_MIN_ROWS rows) differ from the shipped model by
# CAVEAT_AT or more at the median gets a caveat wherever a TTFT is printed
CAVEAT_AT, CAVEAT_MIN_ROWS = 0.25, 3


@dataclass(frozen=True)
class Evidence:
    """The shipped prefill model against published prefill times of one model kind (prefill_fit.yaml)."""

    kind: str  # dense, moe or hybrid
    rows: int
    sources: int
    gpus: list[str]
    median_signed: float  # kvplan / published - 1, median over the rows

    def caveat(self, subject: str = "this TTFT is", rate: bool = False) -> str | None:
        """One line when the published times differ from the model by CAVEAT_AT or more, else None;
        `subject` names what it makes too low or too high (a `rate`: the other way round)."""
        if self.rows < CAVEAT_MIN_ROWS or abs(self.median_signed) < CAVEAT_AT:
            return None
        ratio = 1 / (1 + self.median_signed)  # published / kvplan
        how = f"{ratio:.1f}x kvplan's estimate" if ratio > 1 else f"{1 - ratio:.0%} under kvplan's estimate"
        name = "MoE" if self.kind == "moe" else self.kind
        return (
            f"published prefill times of {name} models ran {how} at the median ({self.rows} rows from "
            f"{self.sources} sources on {', '.join(self.gpus)}; prefill_fit.yaml): {subject} likely too "
            f"{'low' if (ratio > 1) != rate else 'high'}"
        )


@functools.cache
def prefill_evidence() -> dict[str, Evidence]:
    """The shipped prefill model's median error per model kind on published prefill times."""
    rows = _fit_file().get("evidence") or []
    return {
        str(r["kind"]): Evidence(
            str(r["kind"]),
            int(r["rows"]),
            int(r["sources"]),
            [str(g) for g in r["gpus"]],
            float(r["median_signed"]),
        )  # fmt: skip
        for r in rows
    }


def prefill_caveat(kind: str, subject: str = "this TTFT is", rate: bool = False) -> str | None:
    """The caveat for a model of this kind (dense, moe, hybrid), if its published prefills call for one."""
    ev = prefill_evidence().get(kind)
    return ev.caveat(subject, rate) if ev is not None else None


@dataclass(frozen=True)
class PrefillWork:
    """What one token of a prompt costs in FLOPs, whole model, and the peaks it runs at (per GPU)."""

    active_params: int  # GEMM parameters one prompt token passes through (routed experts: its top-k),
    # without the input embedding (a gather) and the LM head (the last token only)
    attention_layers: int  # layers whose attention reads the whole context
    attention_width: int  # query heads x head dim of one such layer
    gemm_peak_flops_per_s: float  # dense peak of the weights' dtype
    attention_peak_flops_per_s: float  # dense bf16 peak
    weight_bytes_per_gpu: int  # every weight of every stage's GPU, all routed experts: one stream
    head_params: int = 0  # the LM head (or the tied embedding it reads): once per prompt, vocab-parallel


@dataclass(frozen=True)
class PrefillTime:
    tokens: int
    cached_tokens: int
    gemm_ms: float  # the larger of the GEMM FLOPs and one stream of the weights
    attention_ms: float
    communication_ms: float
    launch_ms: float
    overhead_ms: float
    total_ms: float
    compute_bound: bool  # GEMM FLOPs, not the weight stream, set gemm_ms
    moe_activation_ms: float = 0.0  # the fused MoE's activation buffers written and read (MoE acts)
    offload_ms: float = 0.0  # --cpu-offload-gb: the offloaded weights' copy over PCIe, once per forward pass

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Work:
    compute_s: float  # the GEMM FLOPs alone
    stream_s: float  # one stream of every weight
    attention_s: float
    comm_s: float
    comm_latency_s: float  # the all-reduces' and hops' fixed cost, which a step pays once for all its tokens
    launch_s: float
    moe_act_s: float = 0.0  # the fused MoE's activation buffers (MoE acts)


def _work(
    inp: DecodeInputs, work: PrefillWork, prompts: int, tokens: int, cached_tokens: int,
    c: Coefficients, p: PrefillCoefficients,
) -> _Work:  # fmt: skip
    """`prompts` prompts of `tokens` new tokens each, after `cached_tokens` each, in one forward pass.
    Under DP attention (SGLang --enable-dp-attention) a prompt lives on one attention-DP rank: its
    attention GEMMs and attention FLOPs run on that rank's attn_tp GPUs, its attention output is
    all-reduced over them; the MLP/MoE side still runs over the TP group, and where the engine
    dispatches tokens all-to-all (expert parallelism) that replaces the MoE layers' all-reduce."""
    tp = max(1, inp.tp)
    attn_tp = max(1, min(tp, inp.attn_tp))
    n = prompts * tokens
    attn_params = _attention_side_params(inp) if attn_tp < tp else 0
    compute = (
        2.0 * (n * (attn_params / attn_tp + (work.active_params - attn_params) / tp) + prompts * work.head_params / tp)
        / (work.gemm_peak_flops_per_s * p.gemm_mfu)
    )  # fmt: skip
    stream = work.weight_bytes_per_gpu / (c.gemm_efficiency * inp.hbm_bytes_per_s)
    if p.moe_gemm_eff != 1.0:
        # the routed experts' part of each runs at moe_gemm_eff of the rate: 1/eff - 1 more of it
        routed_params, routed_bytes = _routed_per_gpu(inp)
        slower = 1.0 / p.moe_gemm_eff - 1.0
        compute += slower * 2.0 * n * routed_params / (work.gemm_peak_flops_per_s * p.gemm_mfu)
        stream += slower * routed_bytes / (c.gemm_efficiency * inp.hbm_bytes_per_s)
    attn_flops = (
        4.0 * prompts * tokens * (cached_tokens + tokens / 2) * work.attention_layers * work.attention_width
    )
    attention = attn_flops / (attn_tp * work.attention_peak_flops_per_s * p.attention_mfu)
    layers = sum(s.layers for s in inp.stages)
    nbytes = n * inp.hidden_size * inp.activation_bytes
    one, _ = allreduce_seconds(nbytes, inp, c)
    attn_one, _ = allreduce_seconds(nbytes, inp, c, None, attn_tp)
    par = inp.parallel
    a2a_layers = inp.moe_layers if par.all_to_all else 0
    a2a = 0.0
    if a2a_layers:
        top_k = next(s.experts.experts_per_token for s in inp.stages if s.experts is not None)
        # the busiest GPU sends its share of the prompt's tokens: n / attn_tp (all_to_all_seconds
        # spreads batch x group_tokens over the EP GPUs)
        sent = math.ceil(n * par.ep / (attn_tp * max(1, par.group_tokens)))
        a2a = a2a_layers * all_to_all_seconds(sent, top_k, inp, c)
    comm = (
        layers * attn_one + (layers - a2a_layers) * one + a2a
        + sum(_hop_seconds(link, n, inp, c) for link in inp.pp_links)
    )  # fmt: skip
    fixed = (layers * inp.tp_link.latency_s(c) if attn_tp > 1 else 0.0) + (
        (layers - a2a_layers) * inp.tp_link.latency_s(c) if tp > 1 else 0.0
    )
    fixed += sum(link.latency_s(c) for link in inp.pp_links)
    return _Work(
        compute, stream, attention, comm, fixed, layers * c.launch_per_layer_s, _moe_acts(inp, n, c)
    )  # fmt: skip


def _routed_per_gpu(inp: DecodeInputs) -> tuple[float, int]:
    """The routed experts' GEMM parameters one token passes through on one GPU (its top-k pairs' share
    on this GPU, balanced over the experts held: its slice of each under TP, whole experts under EP),
    and the bytes of every routed expert this GPU holds, all stages."""
    params, nbytes = 0.0, 0
    for s in inp.stages:
        e = s.experts
        if e is None or not s.moe_layers:
            continue
        per_expert = e.gate_up.k * e.gate_up.n + e.down.k * e.down.n
        params += s.moe_layers * e.experts_per_token * per_expert * e.held / e.num_experts
        nbytes += s.moe_layers * e.held * (e.gate_up.weight_bytes + e.down.weight_bytes)
    return params, nbytes


def _moe_acts(inp: DecodeInputs, tokens: int, c: Coefficients) -> float:
    """Seconds the fused MoE's activation buffers take for `tokens` tokens on one GPU: per token-expert
    pair, gate_up's output (its N slice), the activation's (half of it) and down's (hidden), each
    written and read once; every GPU of a TP group holds all of a token's pairs (its slice of each),
    and under expert parallelism each GPU takes as many pairs from the group (its ranks as loaded)."""
    total = 0.0
    for s in inp.stages:
        e = s.experts
        if e is None or not s.moe_layers:
            continue
        per_pair = 2 * inp.activation_bytes * (e.gate_up.n + e.down.k + e.down.n)
        total += s.moe_layers * tokens * e.experts_per_token * per_pair
    return total / (c.gemm_efficiency * inp.hbm_bytes_per_s)


def _attention_side_params(inp: DecodeInputs) -> int:
    """Parameters of the GEMMs that run on one attention-DP rank (whole model, all stages): each GPU
    holds a 1/attn_tp slice of them."""
    return sum(g.k * g.n * g.count for s in inp.stages for g in s.gemms if g.per_rank) * max(1, inp.attn_tp)


def prefill_time(
    inp: DecodeInputs,
    work: PrefillWork,
    tokens: int,
    cached_tokens: int = 0,
    served: bool = True,
    c: Coefficients | None = None,
    p: PrefillCoefficients | None = None,
    prompts: int = 1,
) -> PrefillTime:
    """`prompts` prompts of `tokens` new tokens after `cached_tokens` each, in one pass on one replica
    (the module docstring's terms); `served`: a request's first token through the server (pays
    ttft_overhead_s), else a bare forward pass."""
    c = c or coefficients()
    p = p or prefill_coefficients()
    w = _work(inp, work, prompts, tokens, cached_tokens, c, p)
    gemm = max(w.compute_s, w.stream_s)
    overhead = p.ttft_overhead_s if served else 0.0
    # the offloaded weights cross PCIe before their layers run, in every stage's pass (step_model.Stage.host_bytes)
    offload = sum(offload_seconds(s.host_bytes, inp) for s in inp.stages)
    total = gemm + w.attention_s + w.comm_s + w.launch_s + w.moe_act_s + overhead + offload
    return PrefillTime(
        tokens=tokens,
        cached_tokens=cached_tokens,
        gemm_ms=gemm * 1e3,
        attention_ms=w.attention_s * 1e3,
        communication_ms=w.comm_s * 1e3,
        launch_ms=w.launch_s * 1e3,
        overhead_ms=overhead * 1e3,
        total_ms=total * 1e3,
        compute_bound=w.compute_s >= w.stream_s,
        moe_activation_ms=w.moe_act_s * 1e3,
        offload_ms=offload * 1e3,
    )


def chunk_seconds(
    inp: DecodeInputs,
    work: PrefillWork,
    tokens: int,
    cached_tokens: int = 0,
    c: Coefficients | None = None,
    p: PrefillCoefficients | None = None,
    decode_batch: int | None = None,
) -> float:
    """What a prefill chunk adds to an engine step that already streams the weights and launches its
    kernels for the decodes beside it (chunked prefill): its GEMM FLOPs, its attention over the cached
    and new tokens, its bytes in the step's all-reduces (their latency the step pays anyway); with
    `decode_batch` (the decodes of that step), the routed experts its tokens touch beyond theirs
    (step_model.moe_prefill_stream_seconds), streamed once at moe_gemm_eff of the rate (as its routed
    FLOPs run)."""
    c = c or coefficients()
    p = p or prefill_coefficients()
    w = _work(inp, work, 1, tokens, cached_tokens, c, p)
    experts = 0.0 if decode_batch is None else moe_prefill_stream_seconds(inp, decode_batch, tokens, c)
    experts /= p.moe_gemm_eff
    comm = max(0.0, w.comm_s - w.comm_latency_s)
    return w.compute_s + w.attention_s + comm + w.moe_act_s + experts


def weight_bytes_per_gpu(inp: DecodeInputs) -> int:
    """Every weight a prefill streams on the GPUs of one replica's stages, one GPU each: the dense
    GEMMs and all routed experts."""
    dense = sum(g.weight_bytes * g.count for s in inp.stages for g in s.gemms)
    return dense + _routed_per_gpu(inp)[1]


def served_tpot_ms(step_ms: float, batch: int, chunk_ms: float, output_tokens: int, ranks: int = 1) -> float:
    """A served request's time per output token at a steady `batch` of requests: its decode step plus
    the other requests' prompts, one per slot every `output_tokens` steps, each riding in the steps
    as a chunk of `chunk_ms` (chunk_seconds). Under DP attention (`ranks` attention-DP ranks) a
    request's steps carry the prompts of its own rank's requests only, the ranks prefilling side by
    side: batch / ranks - 1 of them, each a chunk on one rank."""
    others = math.ceil(batch / max(1, ranks)) - 1
    return step_ms + others * chunk_ms / output_tokens
