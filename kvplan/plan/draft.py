"""The speculative-decoding draft in memory (issue 23): its weights per GPU and its KV per token.

MTP (vLLM `mtp`, SGLang NEXTN) runs the target checkpoint's own MTP layers (config.json
num_nextn_predict_layers, the spec's `mtp_layers`); EAGLE/EAGLE-3 heads are checkpoints of their own,
sized from the config the user gives (--speculative-draft-config); n-gram drafting holds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.errors import UsageError
from kvplan.formats import Format, weight_format
from kvplan.model import kv
from kvplan.model.params import is_moe_layer, param_breakdown
from kvplan.model.weights import StageWeights, param_bytes
from kvplan.request import Speculative
from kvplan.specs.models import Layer, ModelSpec

# vLLM v0.10.2 vllm/v1/spec_decode/eagle.py EagleProposer.load_model: at PP 1 the draft takes the target's embed_tokens, and every method but eagle3 the target's lm_head
SHARED = "embedding shared with the target at PP 1, LM head too except EAGLE-3 (vLLM v0.10.2 vllm/v1/spec_decode/eagle.py load_model)"
# vLLM vllm/model_executor/models/deepseek_mtp.py DeepSeekMultiTokenPredictorLayer: eh_proj = nn.Linear(2 x hidden, hidden), not TP-sliced (recalled, release not re-read)
EH_PROJ = "eh_proj 2 x hidden x hidden, whole on every GPU in the model dtype (vLLM models/deepseek_mtp.py; assumed)"
# SGLang 0.5.x python/sglang/srt/model_executor/model_runner.py init_memory_pool (release not pinned): the draft worker's pool holds draft_runner_cache_size tokens = the target's + max_num_reqs x (steps x topk + draft tokens) + 100
SGLANG_POOL = "SGLang 0.5.x model_runner.py init_memory_pool: draft pool = target tokens + max_num_reqs x (steps x topk + draft tokens) + 100"


@dataclass(frozen=True)
class DraftMemory:
    method: str
    layers: int  # the draft's decoder layers (each with its own KV)
    weight_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: float
    rule: str  # what the figures rest on
    kv_bytes_per_gpu: int = 0  # the draft's share of the KV memory (vLLM) or its own pool (SGLang)
    pool_tokens: int = 0  # tokens the draft's KV holds per GPU
    in_budget: bool = True  # vLLM: inside the KV budget; SGLang: beside it, outside --mem-fraction-static
    kv_layers: tuple[
        Layer, ...
    ] = ()  # the draft's layers with a KV cache (vLLM groups them with the target's)


def draft_memory(
    spec: Speculative | None, model: ModelSpec, stages: list[StageWeights], fmt: Format, tp: int, kv_tp: int
) -> DraftMemory | None:
    """The draft's weights per GPU and KV bytes per token per GPU; None without a draft (n-gram, none)."""
    if spec is None or spec.method == "ngram":
        return None
    if spec.method == "mtp":
        return _mtp(spec, model, stages, fmt, kv_tp)
    if spec.draft is None:
        raise UsageError(
            f"{spec.flag} {spec.method}: give --speculative-draft-config PATH (the draft checkpoint's config.json); "
            "kvplan sizes the draft's weights and KV from it"
        )
    if spec.method == "eagle":
        # an EAGLE head runs on the target's hidden states and shares its embedding and LM head (vLLM
        # llama_eagle.py: fc over [embedding, hidden] of the target's width): a draft of another width or
        # vocabulary cannot load beside this target
        for what, mine, theirs in (("hidden_size", spec.draft.hidden_size, model.hidden_size),
                                   ("vocab_size", spec.draft.vocab_size, model.vocab_size)):  # fmt: skip
            if mine != theirs:
                raise UsageError(
                    f"--speculative-draft-config {spec.draft.name}: {what} {mine:,} differs from {model.name}'s "
                    f"{theirs:,} (an EAGLE head runs on the target's hidden states and shares its embedding); give "
                    "the draft trained for this model"
                )
    return _eagle(spec.method, spec.draft, fmt, tp, kv_tp)


def _mtp_layer_bytes(model: ModelSpec, stages: list[StageWeights]) -> tuple[float, int]:
    """(one MTP decoder layer, its eh_proj) in bytes per GPU of the last stage: a layer like the target's last
    (MoE: one layer's experts + the average of the rest)."""
    last = stages[-1]
    head = 0 if model.tie_word_embeddings else stages[0].embedding_bytes_per_gpu
    dense = last.bytes_per_gpu - last.expert_bytes_per_gpu - last.embedding_bytes_per_gpu - head
    moe = sum(1 for i in last.layers if is_moe_layer(model, i))
    layer = dense / len(last.layers) + (last.expert_bytes_per_gpu / moe if moe else 0)
    return layer, 2 * model.hidden_size * model.hidden_size * 2  # eh_proj in bf16/fp16: 2 bytes a weight


def mtp_checkpoint_bytes(model: ModelSpec, stages: list[StageWeights], tp: int) -> int:
    """The MTP layers' bytes in a checkpoint (whole model): the engines load them only as a speculative draft."""
    if not model.mtp_layers:
        return 0
    layer, eh_proj = _mtp_layer_bytes(model, stages)
    return model.mtp_layers * (math.ceil(layer) * tp + eh_proj)  # the layer split over TP, eh_proj whole


def _mtp(
    spec: Speculative, model: ModelSpec, stages: list[StageWeights], fmt: Format, kv_tp: int
) -> DraftMemory:
    n = model.mtp_layers
    if n < 1:
        raise UsageError(
            f"{spec.flag} mtp: {model.name} has no MTP layers (config.json num_nextn_predict_layers; the spec's "
            "mtp_layers); use eagle/eagle3 with --speculative-draft-config, or ngram"
        )
    layer, eh_proj = _mtp_layer_bytes(model, stages)
    weights = n * (math.ceil(layer) + eh_proj)
    bits = kv.model_bits_per_token([model.layers[-1]], fmt, kv_tp)
    rule = (
        f"MTP: {n} layer(s) from the checkpoint (num_nextn_predict_layers), each one decoder layer like the "
        f"target's last ({layer / 2**30:.2f} GiB per GPU) + {EH_PROJ}; {SHARED}; KV: one layer of the target's "
        "kind per MTP layer (vLLM v0.10.2 vllm/v1/core/kv_cache_utils.py: the draft's attention layers join "
        "the KV cache groups)"
    )
    return DraftMemory("mtp", n, weights, float(n * bits) / 8, rule, kv_layers=(model.layers[-1],) * n)


def _qkv_width(draft: ModelSpec) -> int:
    """Outputs of the first layer's fused q/k/v projection (heads x head_dim + 2 x kv heads x head_dim)."""
    layer = draft.layers[0]
    kv_heads, head_dim = getattr(layer, "num_kv_heads", None), getattr(layer, "head_dim", None)
    if not kv_heads or not head_dim:
        return 0
    return (draft.num_attention_heads + 2 * kv_heads) * head_dim


def _eagle(method: str, draft: ModelSpec, fmt: Format, tp: int, kv_tp: int) -> DraftMemory:
    params = param_breakdown(draft)
    w_fmt = weight_format(draft.weight_dtype)
    h = draft.hidden_size
    fc = (
        (3 if method == "eagle3" else 2) * h * h
    )  # EAGLE fuses [embedding, feature] (2h), EAGLE-3 3 layers' features (3h)
    head = 0
    if method == "eagle3":
        # vLLM llama_eagle3.py: ParallelLMHead(draft_vocab_size, ...), mapped back through d2t; its first
        # layer's qkv_proj takes [embedding, hidden] (2h), h more inputs than the body's count
        head = draft.draft_vocab_size * h if draft.draft_vocab_size else params.lm_head or params.embedding
        fc += h * _qkv_width(draft)
    own = params.body + params.routed_experts + fc + head
    vocab = draft.draft_vocab_size or draft.vocab_size
    eagle3 = (
        f", the first layer's [embedding, hidden] q/k/v inputs included, + its LM head over {vocab:,} tokens"
        if method == "eagle3"
        else ""
    )
    weights = math.ceil(param_bytes(own, w_fmt) / tp)
    bits = kv.model_bits_per_token(list(draft.layers), fmt, kv_tp)
    rule = (
        f"{method}: the draft config {draft.name!r}: {draft.num_layers} layer(s), {own:,} parameters of its own "
        f"in {w_fmt.name} over TP {tp} (body + fc {fc:,}{eagle3}); {SHARED}; "
        "KV: its layers at the target's KV dtype"
    )
    return DraftMemory(
        method, draft.num_layers, weights, float(bits) / 8, rule, kv_layers=tuple(draft.layers)
    )
