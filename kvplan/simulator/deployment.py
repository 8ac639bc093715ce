"""The one place the simulator reads kvplan's plan: a Plan becomes the engine's configuration and
its step model. Everything else in kvplan/simulator/ sees only `Deployment`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvplan.engines import parse_version
from kvplan.engines.base import SglangDetails, VllmDetails
from kvplan.engines.sglang import state_running_cap
from kvplan.engines.vllm import V1_DEFAULT
from kvplan.errors import InfeasibleError
from kvplan.simulator.sglang_engine import (
    DP_ATTENTION_CONSERVATIVENESS,
    MIN_NEW_TOKEN_RATIO_FACTOR,
    SglangEngine,
    new_token_ratios,
)
from kvplan.simulator.step import EngineSim, Recorder, SpecDecode
from kvplan.simulator.steptime import PlanSteps, StepModel
from kvplan.simulator.vllm_engine import VllmEngine
from kvplan.speed.prefill import prefill_caveat
from kvplan.units import ordinal

if TYPE_CHECKING:
    from kvplan.plan.plan import Plan
    from kvplan.request import PlanRequest

SGLANG_MAX_PREFILL_TOKENS = 16384  # python/sglang/srt/server_args.py max_prefill_tokens


@dataclass(frozen=True)
class Deployment:
    """One replica as the engine runs it: its KV pool and batch limits, and a step model."""

    engine: str  # vllm | sglang
    engine_version: str
    model: str
    gpus: str  # e.g. "1x H100-SXM (TP 1, PP 1)"
    block_size: int  # vLLM block / SGLang page, in tokens
    num_gpu_blocks: int  # vLLM: blocks of the pool with the null block; SGLang: pool tokens / page
    pool_tokens: int
    max_num_seqs: int  # vLLM --max-num-seqs; SGLang its max running requests
    max_num_batched_tokens: int  # vLLM's token budget per step
    chunked_prefill_size: int | None  # SGLang (None: no chunking)
    max_prefill_tokens: int  # SGLang
    max_model_len: int
    enable_prefix_caching: bool  # vLLM prefix caching; SGLang's radix cache
    steps: StepModel = field(repr=False, compare=False)
    data_parallel_size: int = 1
    assumptions: tuple[str, ...] = ()
    speculative: SpecDecode | None = None  # speculative decoding as the scheduler sees it
    # SGLang DP attention: ranks of one replica, each its own scheduler and KV pool, stepping together
    # (the MoE layers join them); each rank is simulated on its share (simulator.simulate deals the requests)
    attention_ranks: int = 1
    # vLLM: blocks a request holds whatever its length (a hybrid model's recurrent-state pages)
    fixed_blocks: int = 0
    # SGLang's --schedule-conservativeness as the scheduler sees it: DP attention scales it by 0.3
    schedule_conservativeness: float = 1.0

    def new_engine(self, recorder: Recorder) -> EngineSim:
        if self.engine == "sglang":
            return SglangEngine(
                self.pool_tokens, self.block_size, self.chunked_prefill_size, self.max_prefill_tokens,
                self.max_num_seqs, self.enable_prefix_caching, recorder, self.speculative,
                self.schedule_conservativeness,
            )  # fmt: skip
        return VllmEngine(
            self.num_gpu_blocks, self.block_size, self.max_num_batched_tokens, self.max_num_seqs,
            self.max_model_len, self.enable_prefix_caching, recorder, self.speculative, self.fixed_blocks,
        )  # fmt: skip

    @property
    def shares(self) -> int:
        """Schedulers the deployment's requests are dealt over, each simulated: its data-parallel
        replicas (vLLM's DP engine cores, SGLang's --dp-size) x SGLang's attention-DP ranks."""
        return max(1, self.data_parallel_size) * max(1, self.attention_ranks)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size) + self.fixed_blocks

    def summary(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "model": self.model,
            "gpus": self.gpus,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "pool_tokens": self.pool_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": self.enable_prefix_caching,
            "data_parallel_size": self.data_parallel_size,
            "attention_dp_ranks": self.attention_ranks,
            "speculative": None
            if self.speculative is None
            else {
                "draft_tokens": self.speculative.draft_tokens,
                "lookahead_slots": self.speculative.lookahead,
                "tokens_per_step": self.speculative.tokens_per_step,
            },
        }


def from_plan(plan: Plan, req: PlanRequest) -> Deployment:
    """The deployment `estimate` planned (from `req`), one data-parallel replica of it."""
    s = plan.settings
    notes = []
    if not plan.engine.supported and plan.engine.reason:
        notes.append(plan.engine.reason)  # e.g. an int4 KV cache: no engine serves it, a what-if
    ranks = max(1, plan.cluster.attention_dp_size) if s.engine == "sglang" else 1
    fixed = 0  # vLLM: the state pages a request holds (below)
    if s.engine == "sglang":
        pool_tokens = (
            plan.engine.kv_cache_tokens or plan.kv_pool_tokens
        )  # one attention-DP rank's under DP attention
        num_blocks = pool_tokens // s.block_size
        max_seqs = plan.running_cap_per_rank  # one attention rank's scheduler (Sglang.running_cap)
        details = plan.engine.details
        if isinstance(details, SglangDetails) and details.mamba_cache_slots is not None:
            # model_runner.py: max_num_reqs <= max_mamba_cache_size // 3 (the state pool; estimate's state_pool cap)
            max_seqs = min(max_seqs, state_running_cap(details.mamba_cache_slots, s.enable_prefix_caching))
        chunk = s.chunked_prefill_size if s.chunked_prefill_size and s.chunked_prefill_size > 0 else None
        notes.append(
            f"SGLang {s.engine_version}: pool {pool_tokens:,} tokens (page {s.block_size}), chunked prefill "
            f"{'off' if chunk is None else f'{chunk:,} tokens'}, max running requests {max_seqs:,}, "
            f"--schedule-policy fcfs, radix cache {'on' if s.enable_prefix_caching else 'off'}"
        )
    else:
        num_blocks = plan.engine.num_blocks or plan.num_blocks_per_gpu or 0
        details = plan.engine.details
        single = -(-s.max_model_len // s.block_size)  # blocks of one group a full-length request holds
        held = details.held_blocks_per_request if isinstance(details, VllmDetails) else 0
        # recurrent-state pages: held whatever the length, charged to each request as they are
        fixed = (
            sum(g.blocks_per_request for g in details.groups if g.kind == "state")
            if isinstance(details, VllmDetails)
            else 0
        )
        variable = held - fixed
        grouped = ""
        if num_blocks and isinstance(details, VllmDetails) and variable > single:
            # vLLM's hybrid allocator shares its blocks among KV-cache groups (sliding, full, padding); the
            # simulator's block manager is one group's: its pool is scaled so that a full-length request
            # fills it as it fills vLLM's (exact at max-model-len; shorter requests are charged pro rata)
            grouped = f" ({num_blocks:,} shared by {len(details.groups)} KV-cache groups, scaled by {single}/{variable})"
            fixed = -(-fixed * single // variable)
            num_blocks = max(2, num_blocks * single // variable)
        if fixed:
            grouped += f", {fixed} state page(s) a request"
        pool_tokens = max(0, num_blocks - 1) * s.block_size
        max_seqs = plan.running_cap_per_rank  # --max-num-seqs or vLLM's default (Vllm.running_cap)
        chunk = None
        if parse_version(s.engine_version, "vllm") < V1_DEFAULT:
            notes.append(
                f"vLLM {s.engine_version} ran the V0 engine, whose scheduler is not modelled: V1's is simulated "
                "(one block of the pool kept as its null block)"
            )
        notes.append(
            f"vLLM {s.engine_version} V1 scheduler: {num_blocks:,} KV blocks of {s.block_size} tokens (one is the "
            f"null block){grouped}, --max-num-batched-tokens {s.max_num_batched_tokens:,}, "
            f"--max-num-seqs {max_seqs:,}, prefix caching {'on' if s.enable_prefix_caching else 'off'}"
        )
    if any(a.startswith("sparse attention (DSA)") for a in plan.assumptions):
        notes.append(
            "sparse attention (DSA): the simulated decode steps read each request's held KV bytes per token x its "
            "context (dense), not estimate's top-k reads; their attention time is an upper bound past the top-k"
        )
    if num_blocks <= 1 or pool_tokens <= 0:
        raise InfeasibleError("the plan has no KV pool to simulate (no blocks)")
    d = plan.decode
    per_token = d.kv_bytes_per_request_per_gpu / d.context_tokens if d.context_tokens else 0.0
    per_token = per_token or float(plan.kv_bytes_per_token_per_gpu)
    spec, sim_spec = req.speculative, None
    if spec is not None:
        # vllm/v1/core/sched/scheduler.py (v0.11.0): EAGLE-style drafters (eagle, eagle3, mtp) also hold
        # num_lookahead_tokens = num_speculative_tokens slots; n-gram holds none
        lookahead = spec.draft_tokens if s.engine == "vllm" and spec.method != "ngram" else 0
        sim_spec = SpecDecode(spec.draft_tokens, lookahead, spec.acceptance_length)
        notes.append(
            f"speculative decoding ({spec.method}): a decoding request verifies {spec.verify_tokens} tokens a "
            f"step and keeps {spec.acceptance_length:.2f} on average ({spec.acceptance_source}); kept tokens "
            "accrue evenly (mean-field), not drawn at random; the step is the draft passes plus the verify "
            "step (plan_speed.spec_step); the draft's own prefill is not timed"
        )
    steps = PlanSteps(
        decode_step=d.step,
        kv_bytes_per_token=per_token,
        inputs=d.inputs,
        work=plan.prefill.work,
        speculative=spec,
        parts=d.parts,
        ranks=ranks,
    )
    c = plan.cluster
    conservativeness = 1.0
    if ranks > 1:
        # python/sglang/srt/server_args.py _handle_data_parallelism (0.4-0.5.x): under DP attention
        # schedule_conservativeness *= 0.3, and the scheduler's new-token ratio is 0.7 x that
        conservativeness = DP_ATTENTION_CONSERVATIVENESS
        init = new_token_ratios(conservativeness)[0]
        notes.append(
            f"DP attention scales SGLang's --schedule-conservativeness by {conservativeness} (server_args.py "
            f"_handle_data_parallelism): a rank admits requests reserving {init:.2f} x their remaining output, "
            f"falling to {init * MIN_NEW_TOKEN_RATIO_FACTOR:.4f} (scheduler.py new_token_ratio), not 0.70"
        )
        notes.append(
            f"DP attention: each of the replica's {ranks} attention-DP ranks is simulated as its own scheduler "
            f"(its pool of {pool_tokens:,} tokens, max running {max_seqs:,}), dealt every {ordinal(ranks)} request "
            "(round-robin, SGLang's default --load-balance-method); a rank's steps are timed as if the others "
            f"carried the same load, their decodes and chunks in the same steps (the step model at {ranks} x the "
            "rank's batch); KV usage is the busiest rank's"
        )
    if c.data_parallel_size > 1:
        what = (
            "vLLM DP engine cores (the MoE group's other cores taken as equally loaded)"
            if s.engine == "vllm" and c.expert_parallel_size > 1
            else "data-parallel replicas"
        )
        notes.append(
            f"each of the {c.data_parallel_size} {what} is simulated, dealt every {ordinal(c.data_parallel_size)} "
            "request (round-robin; a --max-concurrency below that keeps that many busy); KV usage is the busiest "
            "one's"
        )
    notes.append(
        f"step time: decode step model ({d.bandwidth_source}) + each prefill chunk's GEMM FLOPs at "
        f"{plan.prefill.mfu:.0%} of {plan.prefill.peak_dtype} peak, attention and all-reduce bytes "
        f"({plan.prefill.source}); decode timed at the batch's mean context, in ~1/32 buckets"
    )
    caveat = prefill_caveat(d.inputs.kind, "TTFT, and TPOT where prompts share steps with decodes, are")
    if caveat:
        notes.append(f"prefill: {caveat}")
    if d.held_out is not None:
        notes.append(f"TPOT {d.held_out.tpot_line()}")
        if line := d.held_out.ttft_line():
            notes.append(f"TTFT {line}")
    return Deployment(
        engine=s.engine,
        engine_version=s.engine_version,
        model=plan.model.name,
        gpus=f"{c.num_gpus}x {plan.gpu.name} (TP {c.tensor_parallel_size}, PP {c.pipeline_parallel_size})",
        block_size=s.block_size,
        num_gpu_blocks=num_blocks,
        pool_tokens=pool_tokens,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        chunked_prefill_size=chunk,
        max_prefill_tokens=SGLANG_MAX_PREFILL_TOKENS,
        max_model_len=s.max_request_tokens,
        enable_prefix_caching=s.enable_prefix_caching,
        steps=steps,
        data_parallel_size=c.data_parallel_size,
        assumptions=tuple(notes),
        speculative=sim_spec,
        attention_ranks=ranks,
        fixed_blocks=fixed,
        schedule_conservativeness=conservativeness,
    )
