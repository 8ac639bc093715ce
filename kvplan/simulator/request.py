"""A request as the simulator carries it: what the workload asked for and what the engine did."""

from __future__ import annotations

from dataclasses import dataclass, field

MASK = (1 << 62) - 1  # block and unit keys are non-negative; anonymous blocks are negative


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload: when it is sent, its lengths, and what its prompt is made of.

    `units` names the prompt's content as runs (unit_id, tokens): two prompts share a prefix exactly
    as far as their runs agree (a Mooncake trace's hash_ids, 512 tokens each). None: a prompt that
    shares nothing (random tokens, vLLM's random dataset)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    units: tuple[tuple[int, int], ...] | None = None


@dataclass(slots=True)
class SimRequest:
    """The engine's view of one request (nano-vllm's Sequence)."""

    rid: int
    spec: RequestSpec
    enter_s: float = 0.0  # sent to the engine (after the client's concurrency gate)
    num_computed: int = 0  # tokens whose KV is in the cache
    num_output: int = 0  # output tokens produced
    first_token_s: float | None = None
    last_token_s: float = 0.0
    finish_s: float | None = None
    preemptions: int = 0
    prefill_tokens: int = 0  # tokens computed by prefill chunks, recomputation included
    hit_tokens: int = 0  # prompt tokens found in the prefix cache (first scheduling only)
    queried_tokens: int = 0  # prompt tokens looked up in the prefix cache (first scheduling only)
    looked_up: bool = False
    blocks: list[int | None] = field(default_factory=list)  # vLLM: block keys held (None: uncached)
    state_blocks: int = 0  # vLLM: the recurrent-state pages it holds whatever its length
    num_cached_blocks: int = 0  # vLLM: leading blocks registered in the prefix cache
    keys: list[int] = field(default_factory=list)  # vLLM: chained hashes of full blocks, built lazily
    node: object = None  # SGLang: the radix node it locks
    prefix_len: int = 0  # SGLang: tokens held through the radix tree
    private_tokens: int = 0  # SGLang: tokens allocated outside the tree
    spec_credit: float = 0.0  # speculative decoding: accepted tokens owed beyond those emitted (< 1)

    @property
    def num_tokens(self) -> int:
        """Prompt plus the outputs so far: what a recompute after preemption must prefill."""
        return self.spec.prompt_tokens + self.num_output

    @property
    def remaining_output(self) -> int:
        return self.spec.output_tokens - self.num_output

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.num_tokens - (1 if self.num_output else 0)
