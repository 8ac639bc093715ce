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

    def token(self, req: SimRequest, t_s: float) -> None: ...

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


def emit_token(rec: Recorder, req: SimRequest, t_s: float, done: list[SimRequest]) -> None:
    """A request samples a token at `t_s` (both engines' rule); `done` collects the finished."""
    req.num_output += 1
    rec.token(req, t_s)
    if req.num_output >= req.spec.output_tokens:
        done.append(req)
