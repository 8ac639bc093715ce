"""How long one engine step takes: kvplan's step model (kvplan/speed/) for a step that holds decodes and
prefill chunks together.

A step = the decode step of its decoding requests (step_model.decode_step: weights, KV reads, MoE,
all-reduces, launch, overhead) + what each prefill chunk adds to it (prefill.chunk_seconds: its GEMM
FLOPs, its causal attention over the cached and new tokens, its bytes in the step's all-reduces; the
step already streams the weights and pays the launches and latencies) + for an MoE model the routed
experts the chunks' tokens touch beyond the decodes' (step_model.moe_prefill_stream_seconds).
Decode steps are timed at the batch's mean context in buckets of about 1/32 (the same figure for
every step inside a bucket, so runs of identical decode steps can be timed at once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvplan.simulator.step import Step
from kvplan.speed import plan_speed
from kvplan.speed import step_model as speed
from kvplan.speed.prefill import PrefillWork, chunk_seconds
from kvplan.speed.step_model import moe_prefill_stream_seconds


def context_bucket(mean_context_tokens: int) -> tuple[int, int]:
    """[lo, hi): the contexts timed as one; about 1/32 of the context wide, at least 16 tokens."""
    c = max(0, mean_context_tokens)
    width = max(16, 1 << max(0, c.bit_length() - 6))
    lo = c // width * width
    return lo, lo + width


class StepModel(Protocol):
    def decode_seconds(self, batch: int, mean_context_tokens: int) -> float: ...

    def prefill_seconds(self, cached_tokens: int, chunk_tokens: int) -> float: ...

    def expert_stream_seconds(self, decodes: int, prefill_tokens: int) -> float: ...


def step_seconds(model: StepModel, step: Step) -> float:
    decodes = step.decodes
    ctx = sum(r.num_tokens for r in decodes) // len(decodes) if decodes else 0
    seconds = model.decode_seconds(len(decodes), ctx)
    chunked = 0
    for _, cached, n in step.prefills:
        seconds += model.prefill_seconds(cached, n)
        chunked += n
    if chunked:
        seconds += model.expert_stream_seconds(len(decodes), chunked)
    return seconds


@dataclass
class PlanSteps:
    """The plan's step model: decode_step for the decodes, prefill.chunk_seconds for the chunks."""

    decode_step: Callable[[int, float, int], speed.StepTime]  # Decode.step(batch, kv bytes/request, ctx)
    kv_bytes_per_token: float  # per GPU, on the stage with the most KV
    inputs: speed.DecodeInputs  # the plan's decode inputs (links, stages)
    work: PrefillWork  # a prompt token's FLOPs on the plan's GPUs
    # speculative decoding (kvplan.request.Speculative): a decode step is the draft passes plus the
    # target verifying each request's tokens (plan_speed.spec_step), with the profile parts it uses
    speculative: Any = None
    parts: Any = None
    # SGLang DP attention: the ranks stepping together, each taken to hold this rank's batch (mean-field)
    ranks: int = 1
    _decode_cache: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)

    def decode_seconds(self, batch: int, mean_context_tokens: int) -> float:
        lo, hi = context_bucket(mean_context_tokens) if batch else (0, 0)
        key = (batch, lo)
        seconds = self._decode_cache.get(key)
        if seconds is None:
            ctx = (lo + hi) // 2
            kv = self.kv_bytes_per_token * ctx
            total = batch * self.ranks  # the step model splits a replica's batch over its attention-DP ranks
            if self.speculative is not None and batch:
                spec = plan_speed.spec_step(self.inputs, self.speculative, total, kv, ctx, self.parts)
                seconds = self._decode_cache[key] = spec.step_ms / 1e3
                return seconds
            # a step of prefill chunks alone still streams the weights once: a one-row pass, no KV read
            step = self.decode_step(max(total, 1), kv, ctx)
            seconds = self._decode_cache[key] = step.tpot_ms / 1e3
        return seconds

    def prefill_seconds(self, cached_tokens: int, chunk_tokens: int) -> float:
        return chunk_seconds(self.inputs, self.work, chunk_tokens, cached_tokens)

    def expert_stream_seconds(self, decodes: int, prefill_tokens: int) -> float:
        """The routed experts the step's prefill tokens touch beyond its decodes' (an MoE model)."""
        return moe_prefill_stream_seconds(self.inputs, decodes * self.ranks, prefill_tokens * self.ranks)


@dataclass(frozen=True)
class FixedSteps:
    """A step model with round numbers, for hand-computed tests: a decode step costs
    base + per_request x batch, a prefill chunk per_prefill_token x tokens."""

    base_s: float = 0.01
    per_request_s: float = 0.0
    per_prefill_token_s: float = 0.0

    def decode_seconds(self, batch: int, mean_context_tokens: int) -> float:
        return self.base_s + self.per_request_s * batch

    def prefill_seconds(self, cached_tokens: int, chunk_tokens: int) -> float:
        return self.per_prefill_token_s * chunk_tokens

    def expert_stream_seconds(self, decodes: int, prefill_tokens: int) -> float:
        return 0.0
