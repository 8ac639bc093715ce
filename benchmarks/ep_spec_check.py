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

Run:  python benchmarks/ep_spec_check.py           # print, write benchmarks/results/ep_spec_check.yaml and
                                                    # README.md's ep-spec-accuracy block
      python benchmarks/ep_spec_check.py --check   # print only
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
from kvplan.specs.registry import load_gpu  # noqa: E402
from kvplan.speed import step_model as speed  # noqa: E402
from kvplan.speed.plan_speed import spec_step  # noqa: E402
from kvplan.speed.prefill import chunk_seconds, served_tpot_ms  # noqa: E402

EP_SPEC_TSV = REPO / "tests" / "fixtures" / "bench" / "ep_spec_runs.tsv"


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
        return served_tpot_ms(step, r.batch, chunk, r.output_len, p.inputs.parallel.attn_dp)
    return step


OUT = REPO / "benchmarks" / "results" / "ep_spec_check.yaml"
README_MARK = (
    "<!-- ep-spec-accuracy: written by benchmarks/ep_spec_check.py -->",
    "<!-- /ep-spec-accuracy -->",
)


def kind_of(row: EpRow) -> str:
    return "speculative" if row.spec else ("dp-attention" if row.dp_attention > 1 else "expert-parallel")


def evaluate() -> dict:
    """Every row's prediction under the coefficients that never saw its source, and the exclusions."""
    rows, excluded = read_ep_spec()
    rows += read_decode_ep(excluded)
    loso = fd.shipped_loso()
    shipped = speed.coefficients()
    records = []
    for row in rows:
        try:
            p = prepare(row)
        except KvplanError as exc:
            excluded.append(f"{row.where}: kvplan cannot plan it: {str(exc).splitlines()[0]}")
            continue
        c = loso.get(row.source, shipped)
        got = predict(p, c)
        rec = {
            "where": row.where,
            "model": row.model,
            "gpus": f"{row.tp}x {row.gpu}",
            "ep": row.ep,
            "dp_attention": row.dp_attention,
            "batch": row.batch,
            "kind": kind_of(row),
            "metric": row.metric,
            "coefficients": "leave-one-source-out" if row.source in loso else "shipped (source never fitted)",
            "published_ms": row.tpot_ms,
            "predicted_ms": round(got, 4),
            "error": round(got / row.tpot_ms - 1, 4),
        }
        if p.speculative is not None:
            s = p.speculative
            rec["speculative"] = (
                f"{s.method} {s.draft_steps} draft / {s.verify_tokens} verified, acceptance {s.acceptance_length:.2f} ({s.acceptance_source.split(':')[0]})"
            )
        records.append(rec)
    return {"records": records, "excluded": excluded, "summary": summarize(records)}


def summarize(records: list[dict]) -> dict:
    out = {}
    for kind in ("all", "expert-parallel", "dp-attention", "speculative"):
        es = [r["error"] for r in records if kind == "all" or r["kind"] == kind]
        if es:
            out[kind] = {
                "rows": len(es),
                "median_abs": round(statistics.median(abs(x) for x in es), 4),
                "median": round(statistics.median(es), 4),
                "worst": max(es, key=abs),
            }
    return out


def readme_block(data: dict) -> str:
    lines = [
        README_MARK[0],
        "",
        "| rows | n | median abs error | median error | worst |",
        "|---|---|---|---|---|",
    ]
    for kind, s in data["summary"].items():
        lines.append(
            f"| {kind} | {s['rows']} | {s['median_abs']:.0%} | {s['median']:+.0%} | {s['worst']:+.0%} |"
        )
    lines += ["", README_MARK[1]]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    import yaml

    data = evaluate()
    print(f"{len(data['records'])} rows predicted, {len(data['excluded'])} excluded:")
    for why in data["excluded"]:
        print(f"  {why}")
    for r in data["records"]:
        sp = f" {r['speculative']}" if "speculative" in r else ""
        print(
            f"  {r['where']:22} {r['model'][:26]:26} {r['gpus']:9} EP {r['ep']} DPA {r['dp_attention']}{sp} "
            f"b {r['batch']:>4}: {r['published_ms']:7.2f} -> {r['predicted_ms']:7.2f} ms ({r['error']:+.0%}) "
            f"[{r['metric']}, {r['coefficients']}]"
        )
    print()
    for kind, s in data["summary"].items():
        print(
            f"{kind:16} rows {s['rows']:3}: median |error| {s['median_abs']:.0%}, median {s['median']:+.0%}, "
            f"worst {s['worst']:+.0%}"
        )
    if "--check" in argv:
        return
    OUT.write_text(yaml.safe_dump(data, sort_keys=False, width=200), encoding="utf-8")
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    if README_MARK[0] in text:
        i, j = text.index(README_MARK[0]), text.index(README_MARK[1]) + len(README_MARK[1])
        readme.write_text(text[:i] + readme_block(data) + text[j:], encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)} and README.md's ep-spec-accuracy block")


if __name__ == "__main__":
    main(sys.argv[1:])
