"""How layers and heads land on GPUs under tensor and pipeline parallelism."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvplan.errors import LayoutInvalid, UsageError
from kvplan.specs.models import GpuSpec, HeadLayer, ModelSpec, SharedKV


@dataclass(frozen=True)
class Layout:
    num_gpus: int
    tp: int
    pp: int
    dp: int  # independent replicas: num_gpus / (tp * pp)


def has_nvls(gpu: GpuSpec) -> bool:
    """Whether NCCL gets NVLink-SHARP (NVLS) buffers on this board: Hopper/Blackwell SXM parts behind
    NVSwitch; A100's NVSwitch, NVLink bridges and PCIe cards have none. Both engines' non-torch memory
    at TP > 1 grows with it."""
    link = gpu.interconnect.kind if gpu.interconnect else ""
    sxm = link.startswith("NVLink") and "bridge" not in link
    return sxm and gpu.arch in ("hopper", "blackwell")


def make_layout(
    num_gpus: int | None, gpus_per_node: int, nodes: int, tp: int | None, pp: int | None
) -> Layout:
    """TP defaults to the GPUs of one node, PP to the number of nodes, the rest is DP."""
    if tp is not None and tp < 1:
        raise UsageError(f"--tensor-parallel-size must be >= 1, got {tp}")
    if pp is not None and pp < 1:
        raise UsageError(f"--pipeline-parallel-size must be >= 1, got {pp}")
    if num_gpus is None:  # a bare GPU name: as many as the layout asks for
        t, p = tp or 1, pp or 1
        return Layout(t * p, t, p, 1)
    t = tp or min(gpus_per_node, num_gpus)
    p = pp or (nodes if tp is None or t * nodes == num_gpus else 1)
    if num_gpus % (t * p):
        raise UsageError(
            f"--gpus gives {num_gpus} GPUs, which TP {t} x PP {p} = {t * p} does not divide; "
            "choose -tp/-pp whose product divides the GPU count"
        )
    return Layout(num_gpus, t, p, num_gpus // (t * p))


def check_tp(spec: ModelSpec, tp: int, pp: int) -> None:
    """vLLM's rules: TP divides the query heads; KV heads split evenly or are replicated."""
    heads = spec.num_attention_heads
    kv_heads = sorted({layer.num_kv_heads for layer in spec.layers if isinstance(layer, HeadLayer)})
    if not _tp_valid(tp, heads, kv_heads):
        ok = valid_tps(spec, heads)
        kv_text = f" and {'/'.join(map(str, kv_heads))} KV heads" if kv_heads else ""
        raise LayoutInvalid(
            f"TP {tp} must divide the {heads} attention heads{kv_text} of {spec.name} "
            f"(KV heads may instead be replicated when TP is a multiple of them); "
            f"valid TP sizes: {', '.join(map(str, ok))}"
        )
    if pp > spec.num_layers:
        raise LayoutInvalid(f"PP {pp} exceeds the {spec.num_layers} layers of {spec.name}")


def _tp_valid(tp: int, heads: int, kv_heads: list[int]) -> bool:
    return heads % tp == 0 and all(kv % tp == 0 or tp % kv == 0 for kv in kv_heads)


def valid_tps(spec: ModelSpec, up_to: int) -> list[int]:
    """TP sizes from 1 to `up_to` that vLLM accepts for this model's heads."""
    kv_heads = sorted({layer.num_kv_heads for layer in spec.layers if isinstance(layer, HeadLayer)})
    return [t for t in range(1, up_to + 1) if _tp_valid(t, spec.num_attention_heads, kv_heads)]


def stage_ranges(num_layers: int, pp: int) -> list[range]:
    """Contiguous layer slices per pipeline stage; extra layers go to the stages before the last
    (vLLM's default partition)."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def stage_layers(spec: ModelSpec, stage: range) -> list:
    """The stage's layers; a shared-KV layer whose producer sits on an earlier stage must keep
    its own copy there, so it is turned into the producer's kind."""
    layers = list(spec.layers)
    out = []
    for i in stage:
        layer = layers[i]
        if isinstance(layer, SharedKV) and i + layer.source < stage.start:
            layer = layers[i + layer.source]
        out.append(layer)
    return out


# --- the inter-node fabric (--network) ---------------------------------------------------------


@dataclass(frozen=True)
class Network:
    """The inter-node fabric, per GPU: one NIC's bandwidth and a small-message latency (`--network`)."""

    name: str  # 400G, or the explicit figures as typed
    gbps: float  # one GPU's NIC, Gb/s
    latency_s: float | None  # None: the coefficients' network_latency_s (NCCL over RDMA)
    what: str  # e.g. "one 400 Gb/s NIC per GPU (InfiniBand NDR / RoCE)"

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8

    def latency(self, rdma_latency_s: float) -> float:
        """Seconds a message: the preset's own, else `rdma_latency_s` (decode_fit.yaml's network_latency_s)."""
        return rdma_latency_s if self.latency_s is None else self.latency_s

    def describe(self, rdma_latency_s: float, default: bool = False) -> str:
        lat = self.latency(rdma_latency_s) * 1e6
        how = "assumed, the default; set --network" if default else "--network"
        return (
            f"inter-node network {self.name}: {self.what}, {self.bytes_per_s / 1e9:g} GB/s and "
            f"{lat:g} us a message per GPU ({how}); all-reduces across nodes move 2 (n - 1) / n x bytes "
            "over it, pipeline hops the activations"
        )


def _rdma(gbps: int, fabric: str) -> Network:
    return Network(f"{gbps}G", gbps, None, f"one {gbps} Gb/s NIC per GPU ({fabric})")


# --network presets. RDMA fabrics take decode_fit.yaml's assumed network_latency_s; 25G Ethernet is
# NCCL's socket transport over TCP, assumed 50 us a message (two kernel network stacks, no RDMA).
NETWORKS = {
    "25G": Network("25G", 25, 50e-6, "one 25 Gb/s Ethernet port per GPU (TCP sockets, no RDMA)"),
    "100G": _rdma(100, "InfiniBand EDR/HDR100 or RoCE"),
    "200G": _rdma(200, "InfiniBand HDR or RoCE"),
    "400G": _rdma(400, "InfiniBand NDR / RoCE"),
    "800G": _rdma(800, "InfiniBand XDR / RoCE"),
}
DEFAULT_NETWORK = NETWORKS["400G"]


# --- expert parallelism and DP attention (issue 23) ---------------------------------------------


@dataclass(frozen=True)
class Sharding:
    """How the GPUs of one replica (TP x PP) hold the routed experts, the attention and the KV.

    The default (`plain_sharding`) is plain tensor parallelism: every matrix, each routed expert
    included, sliced over TP; one attention group of TP GPUs holding the replica's requests.
    An engine's expert-parallel and DP-attention flags change it (engines/vllm.py, engines/sglang.py).
    """

    tp: int
    attn_tp: int  # GPUs of one attention group: KV heads split over them, an MLA latent replicated
    attn_dp: int  # attention-DP ranks per replica: each holds its own requests and its own KV pool
    ep: int  # GPUs the routed experts are spread over whole (1: none)
    expert_tp: int  # GPUs each routed expert is sliced over
    num_experts: int  # routed experts per MoE layer in the checkpoint (0: a dense model)
    local_experts: int  # routed experts (redundant ones included) on the fullest GPU, per MoE layer
    redundant: int = 0  # redundant experts (EPLB) added to the physical expert count
    embedding_replicated: bool = False  # every GPU holds the whole input embedding
    engine_dp: int = 1  # vLLM: data-parallel engine cores whose MoE layers form one group
    a2a_backend: str | None = None  # SGLang --moe-a2a-backend as given
    all_to_all: bool = False  # the MoE layer dispatches and combines tokens all-to-all (no all-reduce)
    rules: tuple[str, ...] = ()  # what the figures rest on, each with its source

    @property
    def plain(self) -> bool:
        return (
            self.ep == 1
            and self.attn_tp == self.tp
            and self.attn_dp == 1
            and self.expert_tp == self.tp
            and not self.redundant
            and not self.embedding_replicated
            and self.engine_dp == 1
        )

    @property
    def expert_share(self) -> float:
        """Fraction of all routed-expert bytes on the fullest GPU."""
        if not self.num_experts:
            return 1 / self.tp
        return self.local_experts / (self.num_experts * self.expert_tp)


def plain_sharding(spec: ModelSpec, tp: int) -> Sharding:
    experts = spec.moe.num_experts if spec.moe is not None else 0
    return Sharding(tp, tp, 1, 1, tp, experts, experts)


def with_eplb_rule(sharding: Sharding, eplb: bool, imbalance: float) -> Sharding:
    """--enable-eplb said: the engine moves experts between ranks while it serves (its memory is the redundant
    experts' only); the step time takes the busiest rank at --moe-imbalance."""
    if not eplb:
        return sharding
    line = (
        "--enable-eplb: the engine rebalances the experts over the EP ranks while it serves; memory follows only "
        f"the redundant experts, and the step time takes the busiest rank at --moe-imbalance {imbalance:g}"
        + (" (assumed: perfectly balanced)" if imbalance == 1.0 else "")
    )
    return dataclasses.replace(sharding, rules=(*sharding.rules, line))
