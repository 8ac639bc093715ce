"""How far kvplan's time figures were from published runs it never saw, in the bucket a plan falls in.

Two sets of held-out rows, both split by source (a source's rows are never on both sides):
  decode   the decode step model's leave-one-source-out errors on published decode runs
           (benchmarks/fit_decode.py; kvplan/data/decode_fit.yaml `evaluation.loso_buckets`): each
           row predicted by a fit that never saw its source
  served   `kvplan simulate` against published `vllm bench serve` / SGLang bench_serving runs, none of
           them fitted (benchmarks/serving_check.py; kvplan/data/served_evidence.yaml): TPOT and TTFT
A bucket is GPU x engine x dense/MoE/hybrid, as every accuracy figure in the README; served runs whose
tensor-parallel group crosses nodes are a bucket of their own (their time is the network's). Where a
plan's bucket has no rows, the figure over every bucket is given instead, and says so.
Nothing here changes a figure: it says how far to trust one. Pure functions; no torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from kvplan import engines
from kvplan.units import plural

SERVED_FILE = "served_evidence.yaml"
DECODE_FILE = "decode_fit.yaml"
KIND_WORDS = {"dense": "dense", "moe": "MoE", "hybrid": "hybrid"}
LEAN = 0.05  # a median signed error this small or smaller is printed as "no lean"


@dataclass(frozen=True)
class HeldOut:
    """kvplan against one set of held-out published rows: its median |error| and median signed error."""

    what: str  # "decode step", "served TPOT", "served TTFT"
    rows: int
    sources: int
    median_abs: float
    median_signed: float  # kvplan / published - 1: > 0 kvplan slower (higher), < 0 faster (lower)
    bucket: bool  # the plan's own bucket (False: every bucket together)

    def words(self) -> str:
        """'decode step 26% off at the median, kvplan slower (19 runs, 2 sources)'."""
        lean = (
            "kvplan slower"
            if self.median_signed >= LEAN
            else "kvplan faster"
            if self.median_signed <= -LEAN
            else "no lean"
        )
        runs = f"{plural(self.rows, 'run')}, {plural(self.sources, 'source')}"
        return f"{self.what} {self.median_abs:.0%} off at the median, {lean} ({runs})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "rows": self.rows,
            "sources": self.sources,
            "median_abs_error": round(self.median_abs, 4),
            "median_signed_error": round(self.median_signed, 4),
            "scope": "this bucket" if self.bucket else "every bucket",
        }


def _read(name: str) -> dict[str, Any]:
    text = resources.files("kvplan").joinpath("data").joinpath(name).read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


@functools.cache
def _canonical_gpu(name: str) -> str:
    """A bench row's GPU column ('H100') as kvplan names the spec ('H100-SXM'); unknown names as given."""
    from kvplan.errors import KvplanError
    from kvplan.specs.registry import load_gpu

    try:
        return load_gpu(name).name
    except KvplanError:
        return name


@functools.cache
def _decode_rows() -> tuple[dict[tuple[str, str, str], HeldOut], HeldOut]:
    ev = _read(DECODE_FILE)["evaluation"]
    out = {}
    for b in ev["loso_buckets"]:
        key = (_canonical_gpu(str(b["gpu"])), str(b["engine"]).lower(), str(b["kind"]))
        out[key] = HeldOut("decode step", int(b["rows"]), int(b["sources"]), float(b["median_abs"]),
                           float(b["median_signed"]), True)  # fmt: skip
    loso = ev["loso"]
    dev = ev["dev"]
    overall = HeldOut("decode step", int(dev["rows"]), int(dev["sources"]), float(loso["median_abs"]),
                      float(loso["median_signed"]), False)  # fmt: skip
    return out, overall


@functools.cache
def _served_rows() -> tuple[dict[tuple[str, str, str, bool, str], HeldOut], dict[str, HeldOut]]:
    data = _read(SERVED_FILE)
    out: dict[tuple[str, str, str, bool, str], HeldOut] = {}
    for b in data["buckets"]:
        for metric in ("tpot", "ttft"):
            m = b.get(metric)
            if not m:
                continue
            key = (
                _canonical_gpu(str(b["gpu"])),
                str(b["engine"]),
                str(b["kind"]),
                bool(b["across_nodes"]),
                metric,
            )
            out[key] = HeldOut(f"served {metric.upper()}", int(m["rows"]), int(m["sources"]),
                               float(m["median_abs"]), float(m["median_signed"]), True)  # fmt: skip
    overall = {
        metric: HeldOut(
            f"served {metric.upper()}",
            int(m["rows"]),
            int(m["sources"]),
            float(m["median_abs"]),
            float(m["median_signed"]),
            False,
        )  # fmt: skip
        for metric, m in data["overall"].items()
    }
    return out, overall


@dataclass(frozen=True)
class BucketAccuracy:
    """What the held-out rows say of one plan's bucket."""

    gpu: str
    engine: str
    kind: str
    across_nodes: bool
    decode: HeldOut
    served_tpot: HeldOut | None
    served_ttft: HeldOut | None

    def bucket_words(self) -> str:
        nodes = ", tensor parallel across nodes" if self.across_nodes else ""
        engine = engines.engine_class(self.engine).display_name
        return f"{KIND_WORDS.get(self.kind, self.kind)} models on {self.gpu} under {engine}{nodes}"

    def tpot_line(self) -> str:
        """One line on the decode step and served TPOT figures."""
        return self._line([self.decode, self.served_tpot])

    def ttft_line(self) -> str | None:
        """One line on served TTFT (None: no served run compared a TTFT anywhere)."""
        return self._line([self.served_ttft]) if self.served_ttft is not None else None

    def _line(self, sets: list[HeldOut | None]) -> str:
        mine = [h for h in sets if h is not None and h.bucket]
        rest = [h for h in sets if h is not None and not h.bucket]
        parts = []
        if mine:
            parts.append(f"published runs of {self.bucket_words()}: " + "; ".join(h.words() for h in mine))
        if rest:
            none = " or ".join(h.what for h in rest)
            parts.append(
                f"no published {none} of {self.bucket_words()}; over every bucket: "
                + "; ".join(h.words() for h in rest)
            )
        return "accuracy (each source held out): " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": {
                "gpu": self.gpu,
                "engine": self.engine,
                "kind": self.kind,
                "across_nodes": self.across_nodes,
            },
            "decode_step": self.decode.to_dict(),
            "served_tpot": self.served_tpot.to_dict() if self.served_tpot else None,
            "served_ttft": self.served_ttft.to_dict() if self.served_ttft else None,
            "source": "benchmarks/fit_decode.py leave-one-source-out (decode_fit.yaml); benchmarks/serving_check.py "
            "(served_evidence.yaml)",
        }


def bucket_accuracy(gpu: str, engine: str, kind: str, across_nodes: bool = False) -> BucketAccuracy:
    """The held-out figures for a plan on `gpu` (kvplan's spec name) under `engine` ('vllm', 'sglang')
    for a model of `kind` (dense, moe, hybrid); a tensor-parallel group `across_nodes` matches served runs
    that crossed nodes only (no decode row does: it then takes every bucket's figure)."""
    decode, decode_all = _decode_rows()
    served, served_all = _served_rows()
    d = None if across_nodes else decode.get((gpu, engine, kind))
    return BucketAccuracy(
        gpu,
        engine,
        kind,
        across_nodes,
        d or decode_all,
        served.get((gpu, engine, kind, across_nodes, "tpot")) or served_all.get("tpot"),
        served.get((gpu, engine, kind, across_nodes, "ttft")) or served_all.get("ttft"),
    )
