"""Hold kvplan's decode step against published runs with expert parallelism, DP attention and
speculative decoding (issue 23). Nothing here is fitted: every row is predicted by coefficients that
never saw its source (its leave-one-source-out fit when the source is a dev source of the decode fit,
else the shipped fit, which never saw frozen or unfitted sources).

Rows (fixed 2026-12-01, before any error was computed):
  - every row of tests/fixtures/bench/ep_spec_runs.tsv;
  - every row of tests/fixtures/bench/decode_runs.tsv that fit_decode.py excludes only because of its
    expert parallelism (an `ep` column above 1 with a stated TP).
Rules, each applied to every row of its kind:
  - MoE layout: EP as stated (SGLang/TensorRT-LLM: attention TP over the TP GPUs, experts over EP GPUs
    each sliced over TP / EP, an all-reduce after them); --enable-dp-attention --dp-size and
    --moe-a2a-backend as the row's server command gives them. A row whose EP is not stated and whose
    server command is not published is excluded (the experts' layout is unknown).
  - Speculative decoding: the published acceptance length when there is one; otherwise, for MTP,
    kvplan's stated default (0.85 per draft token, arXiv:2412.19437); EAGLE/n-gram without a published
    acceptance are excluded (kvplan has no default for them).
  - A row whose concurrency exceeds its server's --max-running-requests is excluded (requests queue; the
    decode batch is not the concurrency).
  - What the figure measures: the source's kind (fit_decode.METRICS: step / serving / batch), except a
    disaggregated decode instance's TPOT, which is a pure decode step.
Error = predicted / published - 1 on the per-token figure (with speculation: time per generated token).

Run:  python benchmarks/ep_spec_check.py
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import fit_decode as fd  # noqa: E402

from kvplan.errors import KvplanError  # noqa: E402
from kvplan.plan.plan import PlanRequest, estimate  # noqa: E402
from kvplan.request import Speculative  # noqa: E402
from kvplan.specs.registry import load_gpu, load_model  # noqa: E402
from kvplan.speed import step_model as speed  # noqa: E402
from kvplan.speed.plan_speed import spec_step  # noqa: E402
from kvplan.speed.prefill import chunk_seconds, served_tpot_ms  # noqa: E402

EP_SPEC_TSV = REPO / "tests" / "fixtures" / "bench" / "ep_spec_runs.tsv"
CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"
EXTRA_SPECS = {"zai-org/GLM-5.2": CORPUS / "glm-5.2.json"}  # models fit_decode's table does not name


@dataclass(frozen=True)
class EpRow:
    where: str  # file:line
    source: str  # fit_decode's source key
    engine: str
    model: str
    gpu: str
    tp: int
    ep: int
    dp_attention: int  # SGLang --dp-size under --enable-dp-attention (1: none)
    a2a: str | None
    batch: int
    input_len: int
    output_len: int
    metric: str
    tpot_ms: float
    spec: tuple[str, int, int, float | None] | None  # method, draft steps, verify tokens, acceptance
    label: str


def _num(text: str) -> float | None:
    m = re.search(r"(\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


def _flag(cmd: str, name: str) -> str | None:
    m = re.search(rf"{re.escape(name)}[ =](\S+)", cmd)
    return m.group(1) if m else None


def read_ep_spec() -> tuple[list[EpRow], list[str]]:
    rows, excluded = [], []
    with EP_SPEC_TSV.open(encoding="utf-8") as fh:
        for line, r in enumerate(csv.DictReader(fh, delimiter="\t"), 1):
            where = f"ep_spec_runs.tsv:{line}"
            cmd = r["full_command"]
            has_cmd = not cmd.startswith("not stated")
            ep = _num(r["ep"]) if not r["ep"].startswith("not stated") else None
            dpa = int(_num(r["dp_size"]) or 1) if r["dp_attention"] == "yes" else 1
            a2a = _flag(cmd, "--moe-a2a-backend") if has_cmd else None
            if ep is None:
                if not has_cmd:
                    excluded.append(f"{where}: MoE layout (EP) not stated and no server command published")
                    continue
                ep = 1.0 if a2a is None and _flag(cmd, "--ep-size") is None else None
                if ep is None:
                    excluded.append(f"{where}: EP set by flags kvplan does not read")
                    continue
            cap = _flag(cmd, "--max-running-requests") if has_cmd else None
            batch = int(_num(r["batch_or_concurrency"]) or 0)
            if cap is not None and cap.isdigit() and batch > int(cap):
                excluded.append(
                    f"{where}: concurrency {batch} above --max-running-requests {cap}: requests queue"
                )
                continue
            spec = None
            if r["spec_method"] not in ("", "none"):
                steps = int(_num(r["spec_steps"]) or _num(r["spec_tokens"]) or 0)
                verify = int(_num(r["spec_tokens"]) or steps)
                if r["spec_steps"] in (
                    "",
                    "not stated",
                ):  # vLLM/TRT-LLM: k speculative tokens, k + 1 verified
                    steps, verify = verify, verify + 1
                acc = (
                    _num(r["acceptance_length"])
                    if r["acceptance_length"][:1].isdigit() or "~" in (r["acceptance_length"][:2])
                    else None
                )
                method = r["spec_method"].lower()
                if acc is None and method != "mtp":
                    excluded.append(f"{where}: {method} without a published acceptance length")
                    continue
                spec = (method, steps, verify, acc)
            metric = "step" if "disaggregated" in r["notes"] else fd.metric_of(r["source_url"])
            rows.append(EpRow(
                where, fd.source_of(r["source_url"]), r["engine"].split(" ")[0], r["model"], r["gpu"],
                int(r["tp"]), int(ep), dpa, a2a, batch, int(_num(r["input_len"]) or 0),
                int(_num(r["output_len"]) or 0), metric, float(r["tpot_ms"]), spec, r["weight_dtype"],
            ))  # fmt: skip
    return rows, excluded


def _kind(url: str) -> tuple[str, str] | None:
    """(source key, what its figure measures), or None when sources.tsv has no entry for it."""
    try:
        return fd.source_of(url), fd.metric_of(url)
    except SystemExit:
        return None


def read_decode_ep(excluded: list[str]) -> list[EpRow]:
    rows = []
    with fd.TSV.open(encoding="utf-8") as fh:
        for line, r in enumerate(csv.DictReader(fh, delimiter="\t"), 1):
            why = fd._exclusion(r, line)
            if why is None or not why.startswith("expert parallelism EP"):
                continue
            kind = _kind(r["source_url"])
            if kind is None:
                excluded.append(f"decode_runs.tsv:{line}: no sources.tsv entry says what its figure measures")
                continue
            i, o, _ = fd._lengths(r)
            rows.append(EpRow(
                f"decode_runs.tsv:{line}", kind[0], r["engine"].split(" ")[0], r["model"],
                r["gpu"], int(r["tp"]), int(r["ep"]), 1, None, int(fd._int(r["batch_or_concurrency"]) or 0), i, o,
                kind[1], float(r["tpot_ms"]), None, r["weight_dtype"],
            ))  # fmt: skip
    return rows


def _spec_of(row: EpRow):
    for prefix, path in EXTRA_SPECS.items():
        if row.model.startswith(prefix):
            return load_model(str(path)), ("fp8" if row.label.startswith("fp8") else None)
    spec, dtype, note = fd._spec({"model": row.model, "weight_dtype": row.label, "gpu": row.gpu})
    if spec is None:
        raise KvplanError(note)
    return spec, dtype


@dataclass
class Prepared:
    row: EpRow
    inputs: speed.DecodeInputs
    kv: int
    ctx: int
    work: object
    speculative: Speculative | None


def prepare(row: EpRow) -> Prepared:
    spec, dtype = _spec_of(row)
    gpu = load_gpu(fd.GPUS.get(row.gpu, row.gpu))
    sp = None
    if row.spec is not None:
        method, steps, verify, acc = row.spec
        sp = Speculative.make(method, steps, verify, acc, "published speculative config")
    p = estimate(PlanRequest(
        model=spec, gpu=gpu, num_gpus=row.tp, tp=row.tp, pp=1, max_model_len=row.input_len + row.output_len,
        weight_dtype=dtype, kv_cache_memory_bytes=8 * 2**30, input_len=row.input_len, output_len=row.output_len,
        engine="sglang", ep_size=row.ep if row.ep > 1 else None, moe_a2a_backend=row.a2a,
        data_parallel_size=row.dp_attention if row.dp_attention > 1 else None,
        enable_dp_attention=row.dp_attention > 1, speculative=sp,
    ))  # fmt: skip
    return Prepared(row, p.decode.inputs, p.decode.kv_bytes_per_request_per_gpu, p.decode.context_tokens,
                    p.prefill.work, sp)  # fmt: skip


def predict(p: Prepared, c: speed.Coefficients) -> float:
    r = p.row
    if p.speculative is not None:
        step = spec_step(p.inputs, p.speculative, r.batch, p.kv, p.ctx, None, c).tpot_ms
    else:
        step = speed.decode_step(p.inputs, r.batch, p.kv, p.ctx, None, c).tpot_ms
    if r.metric == fd.SERVING:
        chunk = chunk_seconds(p.inputs, p.work, r.input_len, 0, c, decode_batch=r.batch) * 1e3  # type: ignore[arg-type]
        return served_tpot_ms(step, r.batch, chunk, r.output_len)
    return step


def main() -> None:
    rows, excluded = read_ep_spec()
    rows += read_decode_ep(excluded)
    loso = fd.shipped_loso()
    shipped = speed.coefficients()
    errs: dict[str, list[float]] = {}
    print(f"{len(rows)} rows to predict, {len(excluded)} excluded:")
    for why in excluded:
        print(f"  {why}")
    for row in rows:
        try:
            p = prepare(row)
        except KvplanError as exc:
            print(f"  {row.where}: excluded: kvplan cannot plan it: {str(exc).splitlines()[0]}")
            continue
        c = loso.get(row.source, shipped)
        which = "LOSO" if row.source in loso else "shipped"
        got = predict(p, c)
        e = got / row.tpot_ms - 1
        kind = "spec" if row.spec else ("dp-attn" if row.dp_attention > 1 else "ep")
        errs.setdefault(kind, []).append(e)
        errs.setdefault("all", []).append(e)
        sp = ""
        if p.speculative is not None:
            sp = f" {p.speculative.method} {p.speculative.draft_steps}/{p.speculative.verify_tokens} acc {p.speculative.acceptance_length:.2f}"
        print(
            f"  {row.where:22} {row.model[:26]:26} {row.tp}x{row.gpu:7} EP {row.ep} DPA {row.dp_attention}{sp} "
            f"b {row.batch:>4}: {row.tpot_ms:7.2f} -> {got:7.2f} ms ({e:+.0%}) [{row.metric}, {which}]"
        )
    print()
    for kind, es in errs.items():
        print(
            f"{kind:8} rows {len(es):3}: median |error| {statistics.median(abs(x) for x in es):.0%}, "
            f"median {statistics.median(es):+.0%}, worst {max(es, key=abs):+.0%}"
        )


if __name__ == "__main__":
    main()
