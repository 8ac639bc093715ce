"""Decode and prefill speed: a decode step, layer by layer and stage by stage.

One GPU of a pipeline stage, per decode step of `batch` requests:
  weights    each weight GEMM: max((bytes + half) / (eff x datasheet bandwidth), FLOPs / (peak x mfu))
             (a GEMM streams its bytes at an efficiency that grows with its size; at large batch it
             becomes compute bound at the dense FLOP/s of its dtype)
  attention  the KV bytes of the live requests at their context, at the kernel curve's bandwidth
             for the bytes one layer's call reads
  MoE        per MoE layer a fixed routing/permute cost; the experts the batch touches are streamed
             as grouped GEMMs (experts_touched)
  comm       two all-reduces per layer under TP: latency + 2 (tp - 1) / tp x bytes / link
  EP         under expert parallelism a GPU holds `local` whole experts; with an all-to-all MoE
             (vLLM EP at DP > 1, SGLang's DeepEP-style backends) each MoE layer's all-reduce is replaced
             by a dispatch and a combine of each token's hidden state x top-k (`ExpertParallel`)
  DP attn    under SGLang's DP attention each attention-DP rank runs batch / dp requests through its
             attention (weights sliced over attention TP only, KV of its own requests)
  launch     a per-layer cost (kernel launches and small ops between the GEMMs)
Stages run one after another for a token (plus one activation hop between stages); with several
requests the pipeline holds up to `pp` micro-batches. A fixed per-step overhead (scheduling,
sampling) is added once.

Coefficients that no spec gives are fitted to published runs (benchmarks/fit_decode.py) and read
once from kvplan/data/decode_fit.yaml; a calibration profile's measured parts replace them term by
term (`Measured`). Pure functions otherwise: no torch, no other file.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any, Protocol

import yaml

FIT_FILE = "decode_fit.yaml"
FITTED = "fitted to published runs"
MEASURED = "measured on this machine"
SHIPPED = "measured on {device}"  # kvplan's shipped profile of that GPU (model_specs/calibrations/)


def is_measured(source: str) -> bool:
    """A term's source is a calibration profile (this machine's, or one kvplan ships)."""
    return source.startswith("measured")


CURVE = "a decode-kernel curve after FlashInfer's published figures (not measured here)"

# the coefficients decode_fit.yaml must hold; each entry there is {value, source}
COEFFICIENTS = (
    "gemm_efficiency",
    "gemm_half_bytes",
    "lowbit_gemm_efficiency",
    "gemm_mfu",
    "attention_efficiency",
    "attention_half_bytes",
    "moe_layer_s",
    "launch_per_layer_s",
    "step_overhead_s",
    "allreduce_latency_s",
    "network_latency_s",
    "network_bytes_per_s",
)


@dataclass(frozen=True)
class Coefficients:
    gemm_efficiency: float  # share of datasheet bandwidth a large weight GEMM streams at
    gemm_half_bytes: float  # GEMM bytes at which it streams at half that
    lowbit_gemm_efficiency: float  # sub-16-bit weights (fp8, int4, fp4) stream at this x the above
    gemm_mfu: float  # share of the dtype's dense FLOP/s a compute-bound decode GEMM reaches
    attention_efficiency: float  # decode attention's peak share of datasheet bandwidth
    attention_half_bytes: float  # bytes of one attention call at which it reaches half that
    moe_layer_s: float  # routing, top-k, permute/unpermute of one MoE layer
    launch_per_layer_s: float  # kernel launches and small ops of one layer
    step_overhead_s: float  # scheduling, sampling, input preparation: once per step
    allreduce_latency_s: float  # one small-message all-reduce (or send) inside a node
    network_latency_s: float  # the same across nodes
    network_bytes_per_s: float  # one GPU's share of the inter-node network
    sources: dict[str, str] = field(default_factory=dict)  # per coefficient: what it was fitted to

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Coefficients:
        missing = [k for k in COEFFICIENTS if k not in data]
        if missing:
            raise ValueError(f"{FIT_FILE}: missing {', '.join(missing)}")
        values = {k: float(data[k]["value"]) for k in COEFFICIENTS}
        return Coefficients(**values, sources={k: str(data[k]["source"]) for k in COEFFICIENTS})

    def to_dict(self) -> dict[str, Any]:
        return {k: {"value": getattr(self, k), "source": self.sources.get(k, "")} for k in COEFFICIENTS}


@functools.cache
def coefficients() -> Coefficients:
    """The shipped coefficients (kvplan/data/decode_fit.yaml), read once."""
    text = resources.files("kvplan").joinpath("data").joinpath(FIT_FILE).read_text(encoding="utf-8")
    return Coefficients.from_dict(yaml.safe_load(text)["coefficients"])


# --- what a calibration profile measured --------------------------------------------------------


class Measured(Protocol):
    """The measured parts of a calibration profile; None where it measured nothing of the kind."""

    def gemm_seconds(self, dtype: str, batch: int, k: int, n: int) -> float | None: ...

    def allreduce_seconds(self, nbytes: int, world_size: int) -> float | None: ...

    def attention_bytes_per_s(self, nbytes: float, batch: int | None = None) -> float | None: ...

    # no launch figure: a profile's launch floor is one trivial kernel, while the launch term is a
    # layer's small ops (norms, rotary, activation, residual adds) between its GEMMs; it stays fitted


# --- the inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gemm:
    """One weight GEMM on one GPU: [k] x [k, n] per token, `count` calls per step."""

    k: int
    n: int
    weight_bytes: int  # one call's weights on this GPU
    dtype: str  # the weight format's name
    lowbit: bool  # under 16 bits per weight
    count: int = 1
    per_rank: bool = False  # attention: runs one attention-DP rank's tokens (batch / attn_dp)


@dataclass(frozen=True)
class Experts:
    """One MoE layer's routed experts on one GPU (TP-sharded), as two grouped GEMMs per expert."""

    num_experts: int
    experts_per_token: int
    gate_up: Gemm  # one expert's (its slice on this GPU)
    down: Gemm
    local: int = 0  # experts this GPU holds (redundant ones included); 0: all of them (plain TP)

    @property
    def held(self) -> int:
        return self.local or self.num_experts


@dataclass(frozen=True)
class Stage:
    """One GPU of one pipeline stage."""

    layers: int
    attention_layers: int  # layers that read a KV cache (attention calls per step)
    gemms: tuple[Gemm, ...]  # dense weights every token reads: attention, dense MLP, shared experts, head
    moe_layers: int
    experts: Experts | None
    kv_share: float  # this stage's share of the binding stage's KV bytes per request
    # --cpu-offload-gb: weights in CPU memory, copied to the GPU before their layer runs in every forward pass
    # (vllm/model_executor/models/utils.py v0.11.0 maybe_offload_to_cpu, SGLang offloader.py OffloaderV1:
    # state_dict().to(device, non_blocking=True) on the compute stream), then streamed from HBM as the rest
    host_bytes: int = 0


# PCIe cards (no NVLink/NVSwitch) all-reduce with NCCL over PCIe, not with a fitted NVLink figure.
# Small-message latency, assumed from a published nccl-tests run on Ada PCIe Gen4 cards like the L40S/L4:
# 8-byte all_reduce_perf on 8x RTX 4090 (two root complexes) ~40-42 us, https://github.com/NVIDIA/nccl/issues/1530
PCIE_ALLREDUCE_LATENCY_S = 40e-6
PCIE_LATENCY_SOURCE = "latency assumed from nccl-tests: an 8-byte all-reduce takes ~40 us on 8 Ada PCIe Gen4 cards (NVIDIA/nccl#1530)"
# Assumed: a PCIe node is a 2-socket host, half its GPUs behind each CPU. NCCL does not use GPU peer-to-peer
# across the CPUs' link by default (NCCL_P2P_LEVEL), so a ring spanning both sockets stages through host
# memory: each byte crosses PCIe twice, half the card's PCIe bandwidth.
PCIE_SOCKETS = 2
CROSS_SOCKET_SHARE = 0.5


@dataclass(frozen=True)
class Link:
    """What a TP all-reduce or a PP send crosses: NVLink/NVSwitch (the GPU spec's bandwidth, the fitted
    all-reduce latency), PCIe (the card's PCIe bandwidth, halved across CPU sockets; an assumed latency)
    or the network across nodes (`--network`)."""

    inter_node: bool
    bytes_per_s: float | None = None  # None: the coefficients' network figure (across nodes)
    latency: float | None = None  # seconds; None: fitted (allreduce_latency_s in a node, network_latency_s)
    name: str = ""  # e.g. "NVLink4", "PCIe (across CPU sockets)", "network 400G"
    source: str = ""  # where its figures come from

    def latency_s(self, c: Coefficients) -> float:
        if self.latency is not None:
            return self.latency
        return c.network_latency_s if self.inter_node else c.allreduce_latency_s

    def bandwidth(self, c: Coefficients) -> float:
        if self.bytes_per_s:
            return self.bytes_per_s
        return c.network_bytes_per_s

    def to_dict(self, c: Coefficients) -> dict[str, Any]:
        return {
            "name": self.name,
            "inter_node": self.inter_node,
            "bytes_per_s": self.bandwidth(c),
            "latency_s": self.latency_s(c),
            "source": self.source,
        }


@dataclass(frozen=True)
class ExpertParallel:
    """Expert parallelism and DP attention on one replica (kvplan/model/parallel.py Sharding), as the
    step sees them. `group_tokens` x the step's batch is what the MoE group routes: vLLM's DP engine
    cores share one MoE group, each assumed as loaded as the one planned."""

    ep: int = 1  # GPUs the routed experts are spread over, whole
    attn_tp: int = 0  # GPUs of one attention group; 0: the TP size
    attn_dp: int = 1  # attention-DP ranks per replica, each with batch / attn_dp requests
    group_tokens: int = 1  # MoE group tokens per planned token (vLLM: --data-parallel-size)
    all_to_all: bool = False  # dispatch + combine instead of the MoE layer's all-reduce
    link: Link | None = None  # what the all-to-all crosses inside a node
    network: Link | None = None  # and across nodes, when the EP group spans them
    remote_share: float = 0.0  # share of a rank's EP peers on other nodes
    imbalance: float = 1.0  # the busiest EP rank's routed-expert work / the mean (assumed)
    sources: tuple[tuple[str, str], ...] = ()  # (term, what it rests on), added to the step's sources


@dataclass(frozen=True)
class DecodeInputs:
    stages: tuple[Stage, ...]
    hidden_size: int
    tp: int
    hbm_bytes_per_s: float  # datasheet
    bf16_flops: float
    fp8_flops: float | None
    tp_link: Link  # what TP all-reduces cross
    pp_links: tuple[Link, ...]  # stage s -> s + 1
    activation_bytes: int = 2  # bf16 activations
    parallel: ExpertParallel = field(default_factory=ExpertParallel)
    host_link_bytes_per_s: float = 0.0  # the card's PCIe link, one direction (what offloaded weights cross)

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def attn_tp(self) -> int:
        return self.parallel.attn_tp or self.tp

    def rank_batch(self, batch: int) -> int:
        """Requests the busiest attention-DP rank runs."""
        return math.ceil(batch / max(1, self.parallel.attn_dp))

    @property
    def moe_layers(self) -> int:
        """MoE layers over every stage (one GPU of each)."""
        return sum(s.moe_layers for s in self.stages if s.experts is not None)

    @property
    def kind(self) -> str:
        """dense, moe or hybrid (layers without a KV cache: Mamba, linear attention): the model kinds
        every accuracy figure is reported by."""
        stage = self.stages[0]
        if stage.attention_layers < stage.layers:
            return "hybrid"
        return "moe" if stage.experts is not None else "dense"


# --- the result ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTime:
    batch: int
    context_tokens: int  # the context each request holds during the step (mean over its decode)
    weight_bytes_read: int  # one replica's slowest path: every stage's GPU, summed
    kv_bytes_read: int
    weights_ms: float
    attention_ms: float
    moe_ms: float
    communication_ms: float
    pp_hop_ms: float
    launch_ms: float
    overhead_ms: float
    tpot_ms: float
    tokens_per_s: float  # per replica
    sources: dict[str, str]  # per term: fitted to published runs, or measured on this machine
    all_to_all_ms: float = 0.0  # expert-parallel dispatch + combine (part of tpot_ms)
    attention_batch: int = 0  # requests one attention-DP rank runs (the batch without DP attention)
    offload_ms: float = 0.0  # --cpu-offload-gb: the offloaded weights' copy over PCIe (part of tpot_ms)

    @property
    def memory_ms(self) -> float:
        """Weights, attention and expert reads: the part a faster memory would shrink."""
        return self.weights_ms + self.attention_ms + self.moe_ms

    def to_dict(self) -> dict:
        return {**asdict(self), "memory_ms": self.memory_ms}


def experts_touched(batch: int, num_experts: int, top_k: int) -> float:
    """Expected fraction of a layer's routed experts that `batch` tokens touch: 1 - (1 - k/E)^batch."""
    if not num_experts:
        return 1.0
    return 1.0 - (1.0 - top_k / num_experts) ** batch


# --- the terms -----------------------------------------------------------------------------------


def gemm_seconds(
    g: Gemm, batch: int, inp: DecodeInputs, c: Coefficients, measured: Measured | None = None
) -> tuple[float, bool]:
    """(seconds of one call, measured?): the roofline of streaming its weights and its FLOPs."""
    if measured is not None:
        t = measured.gemm_seconds(g.dtype, batch, g.k, g.n)
        if t is not None:
            return t, True
    eff = c.gemm_efficiency * (c.lowbit_gemm_efficiency if g.lowbit else 1.0)
    stream = (g.weight_bytes + c.gemm_half_bytes) / (eff * inp.hbm_bytes_per_s)
    peak = inp.fp8_flops if g.dtype == "fp8" and inp.fp8_flops else inp.bf16_flops
    compute = 2.0 * batch * g.k * g.n / (peak * c.gemm_mfu)
    return max(stream, compute), False


def attention_seconds(
    kv_bytes: float,
    calls: int,
    inp: DecodeInputs,
    c: Coefficients,
    measured: Measured | None = None,
    batch: int | None = None,
) -> tuple[float, bool]:
    """`calls` attention kernels reading `kv_bytes` together (`batch` sequences each), at the measured
    bandwidth for one call, else the curve's."""
    if not calls or kv_bytes <= 0:
        return 0.0, measured is not None and measured.attention_bytes_per_s(1.0) is not None
    per_call = kv_bytes / calls
    if measured is not None:
        bw = measured.attention_bytes_per_s(per_call, batch)
        if bw:
            return kv_bytes / bw, True
    bw = inp.hbm_bytes_per_s * c.attention_efficiency * per_call / (per_call + c.attention_half_bytes)
    return kv_bytes / bw, False


def allreduce_seconds(
    nbytes: int, inp: DecodeInputs, c: Coefficients, measured: Measured | None = None, world: int = 0
) -> tuple[float, bool]:
    """One ring all-reduce of `nbytes` over `world` GPUs (the TP group unless given):
    latency + 2 (n - 1) / n x bytes / link."""
    n = world or inp.tp
    if n <= 1:
        return 0.0, False
    if measured is not None and not inp.tp_link.inter_node:
        t = measured.allreduce_seconds(nbytes, n)
        if t is not None:
            return t, True
    link = inp.tp_link
    return link.latency_s(c) + 2 * nbytes * (n - 1) / n / link.bandwidth(c), False


def all_to_all_seconds(batch: int, top_k: int, inp: DecodeInputs, c: Coefficients) -> float:
    """One MoE layer's dispatch and combine under expert parallelism, on the busiest GPU. The MoE group
    routes batch x group_tokens tokens, spread evenly over the ep GPUs; each sends every token's hidden
    state to its top-k experts, (ep - 1) / ep of them on other GPUs, and takes the results back:
    2 x (latency + imbalance x tokens / ep x top_k x hidden x bytes x (ep - 1) / ep / link), the part
    bound for other nodes over the network concurrently with the rest over NVLink/PCIe."""
    p = inp.parallel
    if not p.all_to_all or p.ep <= 1 or p.link is None:
        return 0.0
    tokens = math.ceil(batch * p.group_tokens / p.ep)
    out = p.imbalance * tokens * top_k * inp.hidden_size * inp.activation_bytes * (p.ep - 1) / p.ep
    local = out * (1 - p.remote_share) / p.link.bandwidth(c)
    latency = p.link.latency_s(c)
    remote = 0.0
    if p.network is not None and p.remote_share > 0:
        remote = out * p.remote_share / p.network.bandwidth(c)
        latency = max(latency, p.network.latency_s(c))
    return 2 * (latency + max(local, remote))


@dataclass
class _Terms:
    weights: float = 0.0
    attention: float = 0.0
    moe: float = 0.0
    comm: float = 0.0
    a2a: float = 0.0
    launch: float = 0.0
    offload: float = 0.0
    weight_bytes: int = 0
    kv_bytes: int = 0
    measured: set[str] = field(default_factory=set)

    @property
    def total(self) -> float:
        return self.weights + self.attention + self.moe + self.comm + self.a2a + self.launch + self.offload


def _stage_terms(
    s: Stage, batch: int, kv_bytes_per_request: float, inp: DecodeInputs, c: Coefficients,
    measured: Measured | None, queries: int = 1,
) -> _Terms:  # fmt: skip
    t = _Terms()
    rank = inp.rank_batch(batch)
    requests = rank  # KV is read per request, once for all its query tokens
    rank, batch = rank * queries, batch * queries  # tokens through the GEMMs, experts and links
    for g in s.gemms:
        sec, m = gemm_seconds(g, rank if g.per_rank else batch, inp, c, measured)
        t.weights += sec * g.count
        t.weight_bytes += g.weight_bytes * g.count
        if m:
            t.measured.add("weights")
    kv = requests * kv_bytes_per_request * s.kv_share
    t.kv_bytes = round(kv)
    t.attention, m = attention_seconds(kv, s.attention_layers, inp, c, measured, requests)
    if m:
        t.measured.add("attention")
    moe_layers = s.moe_layers if s.experts is not None else 0
    if s.experts is not None and s.moe_layers:
        t.moe, expert_bytes, m = _moe_seconds(s.experts, batch, inp, c, measured)
        t.moe = s.moe_layers * (t.moe + c.moe_layer_s)
        t.weight_bytes += s.moe_layers * expert_bytes
        if m:
            t.measured.add("moe")
        t.a2a = s.moe_layers * all_to_all_seconds(batch, s.experts.experts_per_token, inp, c)
    # each layer: the attention output's all-reduce over the attention group (one rank's tokens), the
    # MLP's over the TP group, except in MoE layers whose all-to-all replaces it
    attn, m1 = allreduce_seconds(rank * inp.hidden_size * inp.activation_bytes, inp, c, measured, inp.attn_tp)
    mlp, m2 = allreduce_seconds(batch * inp.hidden_size * inp.activation_bytes, inp, c, measured)
    mlp_layers = s.layers - (moe_layers if t.a2a else 0)
    t.comm = s.layers * attn + mlp_layers * mlp
    if m1 or m2:
        t.measured.add("communication")
    t.launch = s.layers * c.launch_per_layer_s
    t.offload = offload_seconds(s.host_bytes, inp)
    return t


def offload_seconds(host_bytes: int, inp: DecodeInputs) -> float:
    """The offloaded weights' copy over the card's PCIe link, at its datasheet rate, once per forward pass."""
    if not host_bytes:
        return 0.0
    return host_bytes / inp.host_link_bytes_per_s


def _moe_seconds(
    e: Experts, batch: int, inp: DecodeInputs, c: Coefficients, measured: Measured | None,
    extra_tokens: int = 0,
) -> tuple[float, int, bool]:  # fmt: skip
    """One MoE layer's expert reads: (seconds, bytes, measured?). The engines run each projection of
    the routed experts as one grouped/fused GEMM over every touched expert (vLLM's fused_moe Triton
    kernel, vllm/model_executor/layers/fused_moe/fused_moe.py; SGLang's, srt/layers/moe/fused_moe_triton),
    so its fixed cost is paid once per projection, not once per expert. A profile's GEMM points time
    it as one GEMM streaming the touched experts' weights (touched x k x n) at the tokens each expert
    sees; the fitted roofline as one GEMM of the touched experts' bytes."""
    p = inp.parallel
    tokens = batch * p.group_tokens + extra_tokens  # what the MoE group routes
    touched = e.held * experts_touched(tokens, e.num_experts, e.experts_per_token)
    routed = tokens * e.experts_per_token * e.held / e.num_experts  # token-expert pairs on this GPU
    if e.local:  # whole experts under EP: the busiest rank carries `imbalance` x the mean
        touched = min(float(e.held), touched * p.imbalance)
        routed *= p.imbalance
    tokens_per_expert = max(1, round(routed / touched)) if touched else 1
    secs, is_measured = 0.0, False
    nbytes = 0
    for g in (e.gate_up, e.down):
        grouped = Gemm(g.k, g.n, round(g.weight_bytes * touched), g.dtype, g.lowbit)
        one = (
            measured.gemm_seconds(g.dtype, tokens_per_expert, g.k, max(1, round(g.n * touched)))
            if measured is not None
            else None
        )
        if one is not None:
            secs += one
            is_measured = True
        else:
            sec, _ = gemm_seconds(grouped, max(1, round(routed)), inp, c)
            secs += sec
        nbytes += grouped.weight_bytes
    return secs, nbytes, is_measured


def moe_prefill_stream_seconds(
    inp: DecodeInputs, decode_batch: int, prefill_tokens: int, c: Coefficients | None = None
) -> float:
    """What prefill tokens add to a step's routed-expert reads: a step of `decode_batch` decodes streams
    the experts those tokens touch (decode_step); prefill tokens riding in the same step (chunked
    prefill) touch more of them, up to all (1 - (1 - k/E)^n over every token routed), and each touched
    expert's weights are streamed once a step whatever the tokens it sees. Their FLOPs are
    prefill.chunk_seconds'; this is the extra stream alone, on the busiest GPU, every stage's MoE layers."""
    if prefill_tokens <= 0:
        return 0.0
    c = c or coefficients()
    extra_bytes = 0.0
    for s in inp.stages:
        e = s.experts
        if e is None or not s.moe_layers:
            continue
        _, with_prefill, _ = _moe_seconds(e, decode_batch, inp, c, None, prefill_tokens)
        _, decodes_only, _ = _moe_seconds(e, decode_batch, inp, c, None)
        extra_bytes += s.moe_layers * max(0, with_prefill - decodes_only)
    eff = c.gemm_efficiency
    return extra_bytes / (eff * inp.hbm_bytes_per_s)


def _hop_seconds(link: Link, batch: int, inp: DecodeInputs, c: Coefficients) -> float:
    """One stage's activations (batch x hidden) sent to the next stage."""
    return link.latency_s(c) + batch * inp.hidden_size * inp.activation_bytes / link.bandwidth(c)


OFFLOAD_SOURCE = (
    "--cpu-offload-gb: each forward pass copies the offloaded layers' weights to the GPU before they run, at "
    "the card's datasheet PCIe rate, one direction (pinned host-to-device copies reach less: the least it takes)"
)
TERMS = ("weights", "attention", "moe", "communication", "pp_hop", "launch", "overhead")


def decode_step(
    inp: DecodeInputs,
    batch: int,
    kv_bytes_per_request: float,
    context_tokens: int = 0,
    measured: Measured | None = None,
    c: Coefficients | None = None,
    queries: int = 1,
) -> StepTime:
    """One decode step of `batch` requests on one replica, each holding `kv_bytes_per_request` per GPU
    (on the stage with the most KV). A request's token crosses the stages one after another; with
    several requests the pipeline carries up to `pp` micro-batches, each stage taking its turn.
    `queries` > 1: each request runs that many tokens (a speculative verify step): GEMMs, experts and
    links carry batch x queries tokens, attention reads each request's KV once."""
    c = c or coefficients()
    micro = max(1, min(batch, inp.pp))
    mb = math.ceil(batch / micro)
    per_stage = [_stage_terms(s, mb, kv_bytes_per_request, inp, c, measured, queries) for s in inp.stages]
    hops = sum(_hop_seconds(link, mb * queries, inp, c) for link in inp.pp_links)
    through = sum(t.total for t in per_stage) + hops  # one micro-batch through every stage
    busiest = micro * max(t.total for t in per_stage)  # the busiest stage serving every micro-batch
    scale = max(through, busiest) / through if through else 1.0  # > 1 only when stages queue
    tpot_s = max(through, busiest) + c.step_overhead_s
    measured_terms = set().union(*(t.measured for t in per_stage))

    def ms(x: float) -> float:
        return x * scale * 1e3

    label = getattr(measured, "label", MEASURED)
    sources = {term: label if term in measured_terms else FITTED for term in TERMS}
    if "attention" not in measured_terms:
        sources["attention"] = CURVE
    p = inp.parallel
    sources.update(dict(p.sources))  # expert parallelism and DP attention: all_to_all and what they rest on
    if any(s.host_bytes for s in inp.stages):
        sources["offload"] = OFFLOAD_SOURCE
    rank = inp.rank_batch(batch)
    return StepTime(
        batch=batch,
        context_tokens=context_tokens,
        weight_bytes_read=sum(t.weight_bytes for t in per_stage),
        kv_bytes_read=round(rank * kv_bytes_per_request * sum(s.kv_share for s in inp.stages)),
        weights_ms=ms(sum(t.weights for t in per_stage)),
        attention_ms=ms(sum(t.attention for t in per_stage)),
        moe_ms=ms(sum(t.moe for t in per_stage)),
        communication_ms=ms(sum(t.comm for t in per_stage)),
        pp_hop_ms=ms(hops),
        launch_ms=ms(sum(t.launch for t in per_stage)),
        overhead_ms=c.step_overhead_s * 1e3,
        tpot_ms=tpot_s * 1e3,
        tokens_per_s=batch / tpot_s,
        sources=sources,
        all_to_all_ms=ms(sum(t.a2a for t in per_stage)),
        attention_batch=rank,
        offload_ms=ms(sum(t.offload for t in per_stage)),
    )
