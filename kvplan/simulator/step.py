"""What one engine step runs, and what the engines report back to the event loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kvplan.simulator.request import SimRequest


@dataclass(slots=True)
class Step:
    """One forward pass: requests decoding one token each, and prefill chunks (request, tokens
    already in the cache before the chunk, chunk tokens)."""

    decodes: list[SimRequest] = field(default_factory=list)
    prefills: list[tuple[SimRequest, int, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills


class Recorder(Protocol):
    """Where an engine reports tokens, finished requests and preemptions (metrics.py)."""

    def token(self, req: SimRequest, t_s: float, same_chunk: bool = False) -> None: ...

    def finished(self, req: SimRequest, t_s: float) -> None: ...

    def preempted(self, req: SimRequest) -> None: ...


class EngineSim(Protocol):
    """The two engines' schedulers behind one face (vllm_engine.py, sglang_engine.py)."""

    running: list[SimRequest]

    def add(self, req: SimRequest) -> None: ...

    def has_work(self) -> bool: ...

    def schedule(self) -> Step: ...

    def complete(self, step: Step, t_s: float) -> None: ...

    def stretch_limit(self) -> tuple[int, bool]: ...

    def advance(self, n: int, t_s: float) -> None: ...

    def kv_used_fraction(self) -> float: ...

    def kv_used_fraction_ahead(self, n: int) -> float:
        """The fraction once every running request has decoded `n` more tokens (a stretch of decodes)."""
        ...


@dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding as the scheduler sees it: a decoding request schedules 1 + `draft_tokens`
    tokens a step (the verified token and the drafts), holds `lookahead` more slots (vLLM allocates
    num_lookahead_tokens for EAGLE-style drafters), and keeps `tokens_per_step` of them on average.

    Acceptance is mean-field, not random: each request accrues tokens_per_step a step and emits the
    whole tokens accrued (at least one: the verified token is always kept), so a request's tokens over
    any run of steps are within one of tokens_per_step x steps."""

    draft_tokens: int
    lookahead: int
    tokens_per_step: float

    def accepted(self, req: SimRequest) -> int:
        """Tokens the request keeps from this step (at most what it still has to produce)."""
        credit = req.spec_credit + self.tokens_per_step
        n = max(1, int(credit))
        req.spec_credit = max(0.0, credit - n)
        return min(n, req.remaining_output)


def emit_tokens(rec: Recorder, req: SimRequest, n: int, t_s: float, done: list[SimRequest]) -> None:
    """A decode step's n tokens for the request, all sampled at `t_s` (speculative decoding keeps several)."""
    for i in range(n):
        emit_token(rec, req, t_s, done, same_chunk=i > 0)


def emit_token(
    rec: Recorder, req: SimRequest, t_s: float, done: list[SimRequest], same_chunk: bool = False
) -> None:
    """A request samples a token at `t_s` (both engines' rule); `done` collects the finished."""
    req.num_output += 1
    rec.token(req, t_s, same_chunk)
    if req.num_output >= req.spec.output_tokens:
        done.append(req)
