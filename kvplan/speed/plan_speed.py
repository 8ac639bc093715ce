"""Decode and prefill figures of a plan: the step model (step_model.py) fed with the plan's numbers.

The plan gives each pipeline stage's weight GEMMs (from the architecture's matrices, in their
formats, split by TP), MoE layers, KV bytes and the links between GPUs (NVLink/PCIe inside a node,
the network across nodes). A calibration profile's measured parts (kernel points, GEMMs timed as
CUDA graphs, all-reduce) replace the fitted terms through `ProfileParts`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kvplan.formats import Format, weight_format
from kvplan.model.capacity import AvgContext, Pool
from kvplan.model.parallel import DEFAULT_NETWORK, Network, Sharding
from kvplan.model.params import ParamBreakdown
from kvplan.model.weights import matrix_format_name
from kvplan.specs.matrices import Matrix, weight_matrices
from kvplan.specs.models import (
    CrossAttention,
    GpuSpec,
    HeadLayer,
    LatentAttention,
    ModelSpec,
    NoCache,
    SharedKV,
)
from kvplan.speed import step_model
from kvplan.speed.evidence import BucketAccuracy, bucket_accuracy
from kvplan.speed.prefill import (
    Evidence,
    PrefillCoefficients,
    PrefillTime,
    PrefillWork,
    chunk_seconds,
    prefill_coefficients,
    prefill_evidence,
    prefill_time,
    served_tpot_ms,
    weight_bytes_per_gpu,
)
from kvplan.units import ceil_div

if TYPE_CHECKING:
    from kvplan.request import PlanRequest, Speculative


class ProfileParts:
    """A calibration profile seen through step_model.Measured, by duck typing: a profile that has
    measured GEMMs (timed as the engine launches them) or all-reduce exposes them; else None."""

    def __init__(self, profile: Any, kv_bits: float = 16, label: str = step_model.MEASURED) -> None:
        self.profile, self.kv_bits, self.label = profile, kv_bits, label

    def gemm_seconds(self, dtype: str, batch: int, k: int, n: int) -> float | None:
        """Only GEMM points timed as the engine launches them (Profile.gemm_as_engine_runs): points
        timed one eager launch at a time carry a host launch gap (about 7 us on an H200) that a
        decode step replayed as a CUDA graph never pays, so the fitted GEMM roofline stands instead."""
        if not getattr(self.profile, "gemm_as_engine_runs", False):
            return None
        f = getattr(self.profile, "gemm_seconds", None)
        return f(dtype, batch, k, n) if callable(f) else None

    def allreduce_seconds(self, nbytes: int, world_size: int) -> float | None:
        f = getattr(self.profile, "allreduce_seconds", None)
        return f(nbytes, world_size) if callable(f) else None

    def attention_bytes_per_s(self, nbytes: float, batch: int | None = None) -> float | None:
        grid = getattr(self.profile, "attention_seconds", None)
        if batch and callable(grid):
            sec = grid(self.kv_bits, batch, nbytes)
            if sec:
                return nbytes / sec
        fit_for = getattr(self.profile, "fit_for", None)
        fit = fit_for(self.kv_bits) if callable(fit_for) else getattr(self.profile, "fit", None)
        f = getattr(fit, "bandwidth", None)
        return f(nbytes) if callable(f) else None

    def __deepcopy__(self, memo: dict) -> ProfileParts:
        return self  # read-only; plans are copied by dataclasses.asdict


class CurveParts(ProfileParts):
    """Only a measured kernel curve (peak, half bytes), as PlanRequest carries it."""

    def __init__(self, peak_bytes_per_s: float, half_bytes: float) -> None:
        super().__init__(None)
        self.peak, self.half = peak_bytes_per_s, half_bytes

    def attention_bytes_per_s(self, nbytes: float, batch: int | None = None) -> float | None:
        return self.peak * nbytes / (nbytes + self.half)


@dataclass(frozen=True)
class ServedTpot:
    """A served request's time per output token at a steady load of `batch` requests of `input_tokens`
    in / `output_tokens` out: its decode step plus the other requests' prompts, which arrive as others
    finish (one per slot every `output_tokens` steps) and are prefilled in chunks within the steps."""

    batch: int
    input_tokens: int
    output_tokens: int
    step_ms: (
        float  # the pure decode step at this batch; under speculative decoding its TPOT (SpecStep.tpot_ms)
    )
    chunk_ms: float  # one other request's prompt riding in the steps (prefill.chunk_seconds)
    tpot_ms: float  # step_ms + (batch - 1) x chunk_ms / output_tokens
    speculative: bool = False  # step_ms is the speculative step's time per output token

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SpecStep:
    """A speculative-decoding step of `batch` requests: `draft_steps` draft passes, then the target
    verifies `verify_tokens` tokens a request; `acceptance_length` of them are kept on average."""

    batch: int
    method: str
    draft_steps: int
    verify_tokens: int
    acceptance_length: float
    acceptance_source: str
    verify_ms: float  # the target's step at batch x verify_tokens tokens (KV read once a request)
    draft_ms: float  # draft_steps x one draft pass
    draft_source: str
    step_ms: float  # verify + draft
    tpot_ms: float  # per output token: step_ms / acceptance_length
    tokens_per_s: float  # output tokens per replica

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spec_step(
    inp: step_model.DecodeInputs,
    spec: Speculative,
    batch: int,
    kv: float,
    ctx: int,
    parts: Any,
    c: step_model.Coefficients | None = None,
) -> SpecStep:
    """The step under speculative decoding. Draft: EAGLE/EAGLE-3 heads and an MTP module are one decoder
    layer like the target's (assumed: one layer's share of the target's plain step, LM head included);
    n-gram drafting is a CPU lookup (assumed free)."""
    plain = step_model.decode_step(inp, batch, kv, ctx, parts, c)
    verify = step_model.decode_step(inp, batch, kv, ctx, parts, c, queries=spec.verify_tokens)
    layers = sum(s.layers for s in inp.stages)
    if spec.method == "ngram":
        one, why = 0.0, "n-gram drafting: a CPU lookup in the prompt, assumed free"
    else:
        # the offloaded layers are the target's (loaded first, they fill the budget): the draft pays no copy
        one = (plain.tpot_ms - plain.overhead_ms - plain.offload_ms) / max(1, layers)
        why = (
            f"{spec.method}: each draft pass assumed one decoder layer like the target's, 1/{layers} of its "
            "plain step less the per-step overhead"
            + (" and the offloaded weights' copy" if plain.offload_ms else "")
        )
    draft = spec.draft_steps * one
    step = verify.tpot_ms + draft
    tpot = step / spec.acceptance_length
    return SpecStep(
        batch, spec.method, spec.draft_steps, spec.verify_tokens, spec.acceptance_length, spec.acceptance_source,
        verify.tpot_ms, draft, why, step, tpot, batch * 1e3 / tpot,
    )  # fmt: skip


@dataclass(frozen=True)
class Decode:
    bandwidth_bytes_per_s: float  # datasheet x the fitted GEMM efficiency (weights); for display
    bandwidth_source: str
    measured: bool  # some term comes from a calibration profile
    inputs: step_model.DecodeInputs
    context_tokens: int  # the context each request holds in the batch-1 row (mean over its decode)
    context_source: str
    batch_1: step_model.StepTime
    at_max_concurrency: step_model.StepTime | None
    at_avg_context: step_model.StepTime | None
    kv_bytes_per_request_per_gpu: int  # at context_tokens, the stage with the most KV
    embedding_bytes_per_gpu: int  # gathered by row, not streamed
    coefficients: step_model.Coefficients
    parts: ProfileParts | None = field(default=None, repr=False, compare=False)
    served: ServedTpot | None = None  # with --input-len/--output-len, at the planned concurrency
    speculative: list[SpecStep] | None = (
        None  # batch 1 and the planned concurrency, under speculative decoding
    )
    # how far the step model and `simulate` were from held-out published runs in this plan's bucket
    held_out: BucketAccuracy | None = field(default=None, compare=False)

    def step(self, batch: int, kv_bytes_per_request: float, context_tokens: int = 0) -> step_model.StepTime:
        """The same model at another batch or context (solve)."""
        return step_model.decode_step(self.inputs, batch, kv_bytes_per_request, context_tokens, self.parts)

    def to_dict(self) -> dict[str, Any]:
        inp = self.inputs
        first = inp.stages[0]
        return {
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "bandwidth_source": self.bandwidth_source,
            "measured": self.measured,
            "model": "step model: weights (GEMM roofline) + attention (kernel curve) + MoE + "
            "TP all-reduces + PP hops + per-layer launch + per-step overhead",
            "inputs": {
                "weight_bytes": sum(g.weight_bytes * g.count for s in inp.stages for g in s.gemms),
                "expert_bytes": sum(
                    s.moe_layers
                    * s.experts.held
                    * (s.experts.gate_up.weight_bytes + s.experts.down.weight_bytes)
                    for s in inp.stages
                    if s.experts is not None
                ),
                "embedding_bytes": self.embedding_bytes_per_gpu,
                "num_experts": first.experts.num_experts if first.experts else 0,
                "experts_per_token": first.experts.experts_per_token if first.experts else 0,
                "layers_per_stage": max(s.layers for s in inp.stages),
                "hidden_size": inp.hidden_size,
                "tp": inp.tp,
                "pp": inp.pp,
                "hbm_bytes_per_s": inp.hbm_bytes_per_s,
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "bandwidth_half_bytes": self.coefficients.gemm_half_bytes,
                "link_bytes_per_s": inp.tp_link.bandwidth(self.coefficients),
                "tp_link_inter_node": inp.tp_link.inter_node,
                "pp_links_inter_node": [link.inter_node for link in inp.pp_links],
                "tp_link": inp.tp_link.to_dict(self.coefficients) if inp.tp > 1 else None,
                "pp_links": [link.to_dict(self.coefficients) for link in inp.pp_links],
                "gemms_per_stage": [sum(g.count for g in s.gemms) for s in inp.stages],
                "moe_layers_per_stage": [s.moe_layers for s in inp.stages],
            },
            "context_tokens": self.context_tokens,
            "context_source": self.context_source,
            "kv_bytes_per_request_per_gpu": self.kv_bytes_per_request_per_gpu,
            "batch_1": self.batch_1.to_dict(),
            "at_max_concurrency": self.at_max_concurrency.to_dict() if self.at_max_concurrency else None,
            "at_avg_context": self.at_avg_context.to_dict() if self.at_avg_context else None,
            "served": self.served.to_dict() if self.served else None,
            "speculative": [x.to_dict() for x in self.speculative] if self.speculative else None,
            "coefficients": self.coefficients.to_dict(),
            "held_out": self.held_out.to_dict() if self.held_out else None,
        }


@dataclass(frozen=True)
class Prefill:
    """One max-length prompt alone on one replica (kvplan/speed/prefill.py), served: its time to first
    token with nothing else running."""

    tokens: int
    ms: float
    mfu: float  # the GEMMs' share of the weights' dtype's dense peak
    peak_dtype: str
    peak_flops_per_gpu: float
    terms: PrefillTime
    work: PrefillWork
    source: str  # where the coefficients come from
    # the shipped prefill model against published prefills of this model kind (None: no rows), and the
    # caveat they call for (None: within prefill.CAVEAT_AT)
    evidence: Evidence | None = None
    caveat: str | None = None
    # the routed experts' GEMMs' share of a dense GEMM's rate (1: no routed experts)
    moe_gemm_eff: float = 1.0

    @property
    def gemm_words(self) -> str:
        """'GEMMs at 50% of fp8 peak', and the routed experts' rate where it differs."""
        words = f"GEMMs at {self.mfu:.0%} of {self.peak_dtype} peak"
        if self.moe_gemm_eff != 1.0:
            words += f", the routed experts' at {self.moe_gemm_eff:.0%} of that rate"
        return words


def attention_width(spec: ModelSpec) -> int:
    """Query width of one attention layer (heads x head dim), for attention FLOPs."""
    for layer in spec.layers:
        if isinstance(layer, LatentAttention):
            return spec.num_attention_heads * (layer.nope_dim + layer.qk_rope_head_dim)
        if isinstance(layer, HeadLayer):
            return spec.num_attention_heads * layer.head_dim
    return spec.hidden_size


# --- the GEMMs of a stage ----------------------------------------------------------------------


def _fmt_of(spec: ModelSpec, m: Matrix, w_fmt: Format, e_fmt: Format, per_matrix: bool) -> Format:
    if per_matrix:
        return weight_format(matrix_format_name(spec, m))
    return e_fmt if m.component == "routed_experts" else w_fmt


def _gemm(mats: list[Matrix], fmt: Format, tp: int, row_parallel: bool) -> step_model.Gemm:
    """Matrices sharing their input, fused into one GEMM (q/k/v, gate/up), split by TP: columns
    of the output for column-parallel layers, rows of the input for row-parallel ones."""
    rows = sum(m.rows for m in mats)
    cols = mats[0].cols
    bits = sum(fmt.matrix_bits(m.rows, m.cols) for m in mats)
    k, n = (ceil_div(cols, tp), rows) if row_parallel else (cols, ceil_div(rows, tp))
    return step_model.Gemm(k, n, ceil_div(ceil_div(bits, 8), tp), fmt.name, fmt.bits_per_value < 16)


_ROW_PARALLEL = ("o_proj", "down_proj", "experts.down_proj", "latent_out")


def _layer_gemms(
    mats: list[Matrix], fmt_of: Any, tp: int, sh: Sharding | None = None
) -> tuple[list[step_model.Gemm], step_model.Gemm | None, step_model.Gemm | None]:
    """(dense GEMMs, one routed expert's gate/up, its down) of one layer's matrices. Under `sh`, attention
    is sliced over the attention group (one DP-attention rank's tokens) and each routed expert over the
    GPUs it is sliced over (1: whole experts under EP); everything else over TP."""
    groups: dict[tuple, list[Matrix]] = {}
    for m in mats:
        if m.component in ("norms", "router", "embedding"):
            continue
        if m.name.startswith("mixer."):  # a Gated DeltaNet's parts: one weight stream, as the whole mixer
            groups.setdefault((m.component, 1, False, "mixer"), []).append(m)
            continue
        row = m.name in _ROW_PARALLEL
        key = (m.component, m.cols, row, m.name if row or m.component == "routed_experts" else "")
        if m.component == "routed_experts" and m.name.startswith("experts.") and not row:
            key = (m.component, m.cols, row, "experts.gate_up")
        groups.setdefault(key, []).append(m)
    dense: list[step_model.Gemm] = []
    gate_up = down = None
    for (comp, _, row, name), ms in groups.items():
        split = tp
        if sh is not None and comp == "attention":
            split = sh.attn_tp
        elif sh is not None and comp == "routed_experts":
            split = sh.expert_tp
        if name == "mixer":  # each part's bits in its own format, streamed as one [params x 1] weight
            fmt = fmt_of(max(ms, key=lambda m: m.params))
            bits = sum(fmt_of(m).matrix_bits(m.rows, m.cols) * m.count for m in ms)
            rows = sum(m.params for m in ms)
            g = step_model.Gemm(1, ceil_div(rows, split), ceil_div(ceil_div(bits, 8), split), fmt.name,
                                fmt.bits_per_value < 16)  # fmt: skip
        else:
            g = _gemm(ms, fmt_of(ms[0]), split, row)
        if sh is not None and comp == "attention" and sh.attn_dp > 1:
            g = dataclasses.replace(g, per_rank=True)
        if comp == "routed_experts" and name == "experts.gate_up":
            gate_up = g
        elif comp == "routed_experts" and name == "experts.down_proj":
            down = g
        else:
            dense.append(g)
    return dense, gate_up, down


def _stage(
    spec: ModelSpec, rng: range, by_layer: dict[int | None, list[Matrix]], fmt_of: Any, tp: int,
    last: bool, kv_share: float, sh: Sharding | None = None,
) -> step_model.Stage:  # fmt: skip
    counts: Counter[step_model.Gemm] = Counter()
    experts = None
    moe_layers = 0
    for i in rng:
        dense, gate_up, down = _layer_gemms(by_layer.get(i, []), fmt_of, tp, sh)
        counts.update(dense)
        if gate_up is not None and down is not None and spec.moe is not None:
            moe_layers += 1
            local = sh.local_experts if sh is not None and sh.ep > 1 else 0
            experts = step_model.Experts(
                spec.moe.num_experts, spec.moe.experts_per_token, gate_up, down, local
            )
    if last:
        head = [m for m in by_layer.get(None, []) if m.component in ("lm_head", "embedding")]
        head = [m for m in head if m.component == "lm_head"] or head  # a tied head reads the embedding
        if head:
            counts[_gemm(head[:1], fmt_of(head[0]), tp, False)] += 1
    gemms = tuple(dataclasses.replace(g, count=n) for g, n in counts.items())
    layers = list(spec.layers)
    attention = sum(1 for i in rng if not isinstance(layers[i], (SharedKV, NoCache)))
    return step_model.Stage(len(rng), attention, gemms, moe_layers, experts, kv_share)


def _pcie(gpu: GpuSpec, first: int, size: int) -> bool:
    """Whether `size` consecutive GPUs of a node from index `first` talk over PCIe: cards without
    NVLink/NVSwitch, and NVLink-bridged pairs (0-1, 2-3, ...) beyond their pair."""
    ic = gpu.interconnect
    if ic is None or ic.kind.lower().startswith("pcie"):
        return True
    pairs = "bridge" in ic.kind.lower() and "pairs" in ic.kind.lower()
    return pairs and not (size == 2 and first % 2 == 0)


def _intra(gpu: GpuSpec, first: int, size: int, gpus_per_node: int) -> step_model.Link:
    """The link `size` consecutive GPUs of one node (from index `first`) cross."""
    if not _pcie(gpu, first, size):
        kind = gpu.interconnect.kind if gpu.interconnect else "NVLink"
        # the spec's figure is both directions together (H100: 18 NVLink4 links x 25 GB/s each way = 450
        # GB/s a direction, "900 GB/s" in NVIDIA's datasheet); a ring all-reduce sends and receives at once
        each_way = gpu.interconnect.bytes_per_s / 2 if gpu.interconnect else None
        return step_model.Link(
            False, each_way, None, kind,
            "half the spec's bidirectional bandwidth (one direction); fitted allreduce_latency_s (decode_fit.yaml)",
        )  # fmt: skip
    # a node of 8 or more PCIe cards is assumed a 2-socket host, half its GPUs behind each CPU
    per_socket = gpus_per_node // step_model.PCIE_SOCKETS if gpus_per_node >= 8 else gpus_per_node
    cross = first // per_socket != (first + size - 1) // per_socket
    share = step_model.CROSS_SOCKET_SHARE if cross else 1.0
    return step_model.Link(
        False, gpu.pcie_bytes_per_s * share, step_model.PCIE_ALLREDUCE_LATENCY_S,
        "PCIe (across CPU sockets)" if cross else "PCIe",
        "bandwidth: the card's PCIe link"
        + (", halved across the CPUs of an assumed 2-socket host (NCCL stages through host memory)" if cross else "")
        + f"; {step_model.PCIE_LATENCY_SOURCE}",
    )  # fmt: skip


def network_link(network: Network | None) -> step_model.Link:
    net = network or DEFAULT_NETWORK
    source = "assumed default (--network)" if network is None else "--network"
    return step_model.Link(
        True, net.bytes_per_s, net.latency_s, f"network {net.name}", f"{net.what}; {source}"
    )


def _links(
    gpu: GpuSpec, tp: int, pp: int, gpus_per_node: int, network: Network | None = None
) -> tuple[step_model.Link, tuple[step_model.Link, ...]]:
    inter = network_link(network)
    tp_link = inter if tp > gpus_per_node else _intra(gpu, 0, tp, gpus_per_node)

    def hop(s: int) -> step_model.Link:  # the last GPU of stage s to the first of s + 1
        last = (s + 1) * tp - 1
        if last // gpus_per_node != (last + 1) // gpus_per_node:
            return inter
        return _intra(gpu, last % gpus_per_node, 2, gpus_per_node)

    return tp_link, tuple(hop(s) for s in range(pp - 1))


def decode_inputs(
    spec: ModelSpec,
    gpu: GpuSpec,
    pool: Pool,
    w_fmt: Format,
    e_fmt: Format,
    per_matrix: bool,
    tp: int,
    gpus_per_node: int,
    network: Network | None = None,
    sh: Sharding | None = None,
    imbalance: float = 1.0,
    host_bytes: tuple[int, ...] = (),
) -> step_model.DecodeInputs:
    """The step model's view of one replica; `host_bytes`: per stage, the weights --cpu-offload-gb keeps in
    CPU memory on each of its GPUs."""
    by_layer: dict[int | None, list[Matrix]] = {}
    for m in weight_matrices(spec):
        by_layer.setdefault(m.layer, []).append(m)

    def fmt_of(m: Matrix) -> Format:
        return _fmt_of(spec, m, w_fmt, e_fmt, per_matrix)

    pp = len(pool.stages)
    # each stage's share of the KV a request's decode reads (state and image K/V too, which grow with no token)
    reads = [pool.read_bytes(i, spec.max_context) for i in range(pp)]
    most = max(reads) or 1
    stages = tuple(
        _stage(
            spec,
            range(s.first_layer, s.first_layer + s.num_layers),
            by_layer,
            fmt_of,
            tp,
            i == pp - 1,
            reads[i] / most,
            None if sh is None or sh.plain else sh,
        )
        for i, s in enumerate(pool.stages)
    )
    tp_link, pp_links = _links(gpu, tp, pp, gpus_per_node, network)
    parallel = (
        step_model.ExpertParallel()
        if sh is None or sh.plain
        else expert_parallel(spec, gpu, sh, gpus_per_node, network, imbalance)
    )
    if any(host_bytes):
        stages = tuple(dataclasses.replace(s, host_bytes=b) for s, b in zip(stages, host_bytes, strict=True))
    return step_model.DecodeInputs(
        stages, spec.hidden_size, tp, gpu.hbm_bytes_per_s, gpu.bf16_dense_flops, gpu.fp8_dense_flops,
        tp_link, pp_links, parallel=parallel, host_link_bytes_per_s=gpu.pcie_bytes_per_s,
    )  # fmt: skip


def expert_parallel(
    spec: ModelSpec, gpu: GpuSpec, sh: Sharding, gpus_per_node: int, network: Network | None, imbalance: float
) -> step_model.ExpertParallel:
    """The step's view of `sh`: whole experts per GPU, the all-to-all and its links, DP-attention ranks
    (whether the engine runs an all-to-all is its own rule, engines/vllm.py and sglang.py)."""
    sources: list[tuple[str, str]] = []
    a2a = sh.all_to_all and sh.ep > 1
    if sh.ep > 1 and sh.num_experts:
        how = "all-to-all dispatch and combine" if a2a else "an all-reduce after the experts (no all-to-all)"
        sources.append(("expert_parallel", (
            f"EP {sh.ep}: each GPU streams the touched ones of its {sh.local_experts} whole experts per MoE layer, "
            f"{sh.local_experts} x (1 - (1 - k/E)^n) expected, n the tokens the MoE group routes; then {how}"
        )))  # fmt: skip
        sources.append(("moe_imbalance", (
            f"the busiest EP rank carries {imbalance:g} x the mean routed-expert work (its tokens, its touched "
            "experts up to all it holds" + (", its all-to-all bytes" if a2a else "") + "): "
            + ("assumed perfectly balanced, the default (--moe-imbalance)" if imbalance == 1.0 else "--moe-imbalance")
        )))  # fmt: skip
    link = net = None
    remote = 0.0
    if a2a:
        inter = network_link(network)
        if sh.ep > gpus_per_node:
            remote = (sh.ep - gpus_per_node) / (sh.ep - 1)
            link, net = _intra(gpu, 0, gpus_per_node, gpus_per_node), inter
        else:
            link = _intra(gpu, 0, sh.ep, gpus_per_node)
        over = f"{link.name} ({link.source})" + (
            f"; the {remote:.0%} of peers on other nodes over {net.name} ({net.source})"
            if net is not None
            else ""
        )
        sources.insert(0, ("all_to_all", (
            "per MoE layer a dispatch and a combine: each GPU sends tokens / EP x top-k x hidden x 2 B (bf16) x "
            f"(EP - 1) / EP out and back, latency + bytes / link each way, over {over}; replaces the MoE layer's "
            "all-reduce; tokens assumed spread evenly over the EP GPUs"
        )))  # fmt: skip
    if sh.attn_dp > 1:
        sources.append(("dp_attention", (
            f"DP attention: each of the {sh.attn_dp} attention-DP ranks runs batch / {sh.attn_dp} requests "
            f"(rounded up) through attention, its weights sliced over attention TP {sh.attn_tp}"
            + (f" and all-reduced over those {sh.attn_tp} GPUs" if sh.attn_tp > 1 else " (no all-reduce)")
            + "; the MoE layers and dense MLPs see the whole batch "
            "(layers/dp_attention.py, 0.5.x)"
        )))  # fmt: skip
    return step_model.ExpertParallel(
        ep=sh.ep if sh.num_experts else 1,
        attn_tp=sh.attn_tp,
        attn_dp=sh.attn_dp,
        group_tokens=sh.engine_dp if sh.num_experts else 1,
        all_to_all=a2a,
        link=link,
        network=net,
        remote_share=remote,
        imbalance=imbalance,
        sources=tuple(sources),
    )


def link_notes(req: PlanRequest, inp: step_model.DecodeInputs) -> list[str]:
    """Assumption lines for the links a plan crosses: PCIe (no NVLink) and the network across nodes."""
    c = step_model.coefficients()
    links = ([inp.tp_link] if inp.tp > 1 else []) + list(inp.pp_links)
    notes = []
    pcie = [link for link in links if link.name.startswith("PCIe")]
    if pcie:
        worst = min(pcie, key=lambda link: link.bandwidth(c))
        what = "TP all-reduces" if inp.tp > 1 and inp.tp_link in pcie else "pipeline hops"
        notes.append(
            f"{what} on {req.gpu.name} cross {worst.name}: {worst.bandwidth(c) / 1e9:g} GB/s, "
            f"{worst.latency_s(c) * 1e6:g} us each; {worst.source}"
        )
    if any(link.inter_node for link in links):
        net = req.network or DEFAULT_NETWORK
        notes.append(net.describe(c.network_latency_s, default=req.network is None))
    elif req.network is not None:
        notes.append(NETWORK_UNUSED.format(name=req.network.name))
    return notes


# said where --network is given to a layout whose links all stay inside one node
NETWORK_UNUSED = (
    "--network {name}: every link of this layout stays inside one node, so the fabric plays no part"
)


# --- the plan's figures --------------------------------------------------------------------------


def decode_context(req: PlanRequest, max_len: int) -> tuple[int, str]:
    """The context a request holds on average while it decodes, and where that figure came from."""
    if req.input_len is not None and req.output_len is not None:
        ctx = min(max_len, req.input_len + req.output_len // 2)
        return ctx, f"input {req.input_len:,} + output {req.output_len:,} / 2 (mean over the decode)"
    if req.avg_context_tokens is not None:
        return req.avg_context_tokens, "--avg-context"
    return max_len, "every request at --max-model-len (give --input-len/--output-len for the mean)"


def parts_of(req: PlanRequest, kv_bits: float = 16) -> ProfileParts | None:
    """The measured parts the request carries; the kernel curve of the plan's KV width."""
    if req.calibration is not None:
        use = req.calibration_use
        label = (
            step_model.SHIPPED.format(device=use.device_name)
            if use is not None and use.shipped
            else f"measured on {use.device_name}, used for this GPU by --force-calibration"
            if use is not None and use.forced
            else step_model.MEASURED
        )
        return ProfileParts(req.calibration, kv_bits, label)
    if req.decode_bandwidth_bytes_per_s:
        return CurveParts(req.decode_bandwidth_bytes_per_s, req.decode_bandwidth_half_bytes)
    return None


def bandwidth_source(step: step_model.StepTime, profile: str | None) -> str:
    """One line: the step's terms and where each one's figure comes from."""
    used = {
        "weights": step.weights_ms,
        "attention": step.attention_ms,
        "MoE": step.moe_ms,
        "all-reduce": step.communication_ms,
        "all-to-all": step.all_to_all_ms,
        "launch": step.launch_ms,
        "overhead": step.overhead_ms,
    }
    key = {"MoE": "moe", "all-reduce": "communication", "all-to-all": "all_to_all"}
    by: dict[str, list[str]] = {}
    for name, ms in used.items():
        if ms or name in ("weights", "overhead"):
            by.setdefault(step.sources[key.get(name, name)], []).append(name)
    parts = []
    for source, names in by.items():
        where = (
            " (decode_fit.yaml)"
            if source == step_model.FITTED
            else f" ({profile})"
            if profile and step_model.is_measured(source)
            else ""
        )
        parts.append(f"{', '.join(names)} {source}{where}")
    return "; ".join(parts)


def plan_speed(
    req: PlanRequest,
    spec: ModelSpec,
    params: ParamBreakdown,
    w_fmt: Format,
    e_fmt: Format,
    pool: Pool,
    tp: int,
    max_len: int,
    max_conc: int,
    avg: AvgContext | None,
    embedding_bytes: int = 0,
    kv_bits: float = 16,
    sh: Sharding | None = None,
    host_bytes: tuple[int, ...] = (),
) -> tuple[Decode, Prefill]:
    """Decode step time at batch 1 and at the planned concurrency (the replica's: every attention-DP
    rank's requests); prefill of one max-length prompt."""
    gpu = req.gpu
    c = step_model.coefficients()
    gpn = req.num_gpus // req.nodes if req.num_gpus and req.nodes > 1 else gpu.gpus_per_node
    per_matrix = bool(spec.weight_formats) and not req.weight_dtype
    inp = decode_inputs(
        spec, gpu, pool, w_fmt, e_fmt, per_matrix, tp, gpn, req.network, sh, req.moe_imbalance, host_bytes
    )
    parts = parts_of(req, kv_bits)
    ctx, ctx_source = decode_context(req, max_len)
    kv_most = max(range(len(pool.stages)), key=lambda i: pool.read_bytes(i, spec.max_context))
    per_req_ctx = pool.read_bytes(kv_most, ctx)
    one = step_model.decode_step(inp, 1, per_req_ctx, ctx, parts)
    full = None
    if max_conc:
        full_kv = pool.read_bytes(kv_most, max_len)
        full = step_model.decode_step(inp, max_conc, full_kv, max_len, parts)
    at_avg = None
    if avg is not None and avg.max_concurrency_per_replica:
        avg_kv = pool.read_bytes(kv_most, avg.avg_context_tokens)
        at_avg = step_model.decode_step(
            inp, avg.max_concurrency_per_replica, avg_kv, avg.avg_context_tokens, parts
        )
    measured = any(step_model.is_measured(v) for v in one.sources.values())
    work = prefill_work(spec, gpu, w_fmt, params, inp)
    spec_rows = None
    if req.speculative is not None:
        spec_rows = [spec_step(inp, req.speculative, 1, per_req_ctx, ctx, parts)]
        if full is not None:
            spec_rows.append(spec_step(inp, req.speculative, full.batch, per_req_ctx, ctx, parts))
    served = None
    if full is not None and req.input_len and req.output_len:
        # the planned concurrency, each request at the mean context of its decode (input + output / 2);
        # under speculative decoding a request's own time per output token is the draft + verify step
        # over the tokens it accepts (spec_step), and the others' prompts still ride in its steps
        if spec_rows is not None:
            step_ms = spec_rows[-1].tpot_ms
        else:
            step_ms = step_model.decode_step(inp, full.batch, per_req_ctx, ctx, parts).tpot_ms
        chunk = chunk_seconds(inp, work, req.input_len, 0, c, decode_batch=full.batch) * 1e3
        tpot = served_tpot_ms(step_ms, full.batch, chunk, req.output_len, inp.parallel.attn_dp)
        served = ServedTpot(
            full.batch, req.input_len, req.output_len, step_ms, chunk, tpot, spec_rows is not None
        )
    decode = Decode(
        bandwidth_bytes_per_s=gpu.hbm_bytes_per_s * c.gemm_efficiency,
        bandwidth_source=bandwidth_source(one, req.decode_bandwidth_source),
        measured=measured,
        inputs=inp,
        context_tokens=ctx,
        context_source=ctx_source,
        batch_1=one,
        at_max_concurrency=full,
        at_avg_context=at_avg,
        kv_bytes_per_request_per_gpu=per_req_ctx,
        embedding_bytes_per_gpu=embedding_bytes,
        coefficients=c,
        parts=parts,
        served=served,
        speculative=spec_rows,
        # the held-out rows judge the fitted model: a measured profile's terms are not what they saw
        held_out=None
        if measured
        else bucket_accuracy(gpu.name, req.engine, inp.kind, inp.tp_link.inter_node),
    )
    pc = prefill_coefficients()
    terms = prefill_time(inp, work, max_len, 0, True, c, pc)
    peak_dtype = "fp8" if work.gemm_peak_flops_per_s != gpu.bf16_dense_flops else "bf16"
    source = prefill_source(pc)
    ev = prefill_evidence().get(inp.kind)
    return decode, Prefill(
        max_len,
        terms.total_ms,
        pc.gemm_mfu,
        peak_dtype,
        work.gemm_peak_flops_per_s,
        terms,
        work,
        source,
        ev,
        ev.caveat() if ev is not None else None,
        pc.moe_gemm_eff if inp.moe_layers else 1.0,
    )


def prefill_work(
    spec: ModelSpec, gpu: GpuSpec, w_fmt: Format, params: ParamBreakdown, inp: step_model.DecodeInputs
) -> PrefillWork:
    """A prompt token's FLOPs and the peaks they run at: fp8 GEMMs where the weights are fp8 and the
    GPU has fp8 tensor cores, else bf16. The embedding gather and the LM head are not per-token GEMMs
    of a prompt (prefill.py's module docstring): the head runs once per prompt."""
    fp8 = w_fmt.name == "fp8" and gpu.fp8_dense_flops is not None
    peak = gpu.fp8_dense_flops if fp8 and gpu.fp8_dense_flops is not None else gpu.bf16_dense_flops
    return PrefillWork(
        active_params=params.per_token_gemm,
        head_params=params.lm_head or params.embedding,  # a tied head is the embedding matrix
        # a prompt's causal attention runs in the self-attention layers; Mllama's cross-attention layers attend to
        # the image's tokens, not the prompt's, and are skipped without an image (mllama.py: cross_attention_states)
        attention_layers=sum(s.attention_layers for s in inp.stages)
        - sum(1 for layer in spec.layers if isinstance(layer, CrossAttention)),
        attention_width=attention_width(spec),
        gemm_peak_flops_per_s=peak,
        attention_peak_flops_per_s=gpu.bf16_dense_flops,
        weight_bytes_per_gpu=weight_bytes_per_gpu(inp),
    )


def prefill_source(pc: PrefillCoefficients) -> str:
    """One line: where the prefill coefficients come from."""
    fitted = any(v.startswith("fitted") for v in pc.sources.values())
    return "fitted to published prefill times (prefill_fit.yaml)" if fitted else "assumed (prefill_fit.yaml)"
