"""Does each shipped calibration profile earn its place? Every published run on its GPU, with and without it.

A profile kvplan ships (model_specs/calibrations/<GPU>.yaml) replaces the fitted terms it measured
(kernel points, GEMMs, launch floor, all-reduce). Measured must beat assumed: held against every
usable published decode run on that GPU (tests/fixtures/bench/decode_runs.tsv, as
benchmarks/fit_decode.py reads them), the profile must not make any bucket (GPU x engine x
dense/MoE/hybrid) worse at the median than the fitted model alone. The fitted model has seen the
dev rows, the profile none: the comparison favours the fitted model, so a profile that passes has
earned it.

Measured profiles that did not pass are kept beside their results (benchmarks/results/*/calibrate_profile.yaml)
and checked too, so a re-measured one can be promoted when it passes.

Run:  python benchmarks/profile_check.py     # per row and per bucket; exit 1 if a shipped profile makes one worse
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import fit_decode as fd  # noqa: E402

from kvplan.calibrate import calibration  # noqa: E402
from kvplan.speed import step_model as speed  # noqa: E402
from kvplan.speed.plan_speed import ProfileParts  # noqa: E402

CALIBRATIONS = HERE.parent / "model_specs" / "calibrations"
CANDIDATES = HERE / "results"


@dataclass(frozen=True)
class Effect:
    bucket: tuple[str, str, str]
    rows: int
    median_without: float  # median |error| of the fitted model alone
    median_with: float  # median |error| with the profile's measured terms

    @property
    def worse(self) -> bool:
        return self.median_with > self.median_without


def kv_bits(p: fd.Prepared) -> float:
    return 8 if p.case.kv_dtype == "fp8" else 16


def with_profile_ms(p: fd.Prepared, profile: calibration.Profile, c: speed.Coefficients) -> float:
    """The published figure as kvplan predicts it with the profile's measured terms."""
    parts = ProfileParts(profile, kv_bits(p), speed.SHIPPED.format(device=profile.device_name))
    r = p.case.row
    step_ms = speed.decode_step(p.inputs, r.batch, p.kv_bytes_per_request, p.context, parts, c).tpot_ms
    return fd.published_ms(p, c) - fd.predict(p, c).tpot_ms + step_ms  # the same prefill share


def profiles() -> list[tuple[Path, bool]]:
    """(path, shipped?) of every shipped profile and every measured one kept with its results."""
    shipped = [(path, True) for path in sorted(CALIBRATIONS.glob("*.yaml"))]
    kept = [(path, False) for path in sorted(CANDIDATES.glob("*/calibrate_profile.yaml"))]
    return shipped + kept


def effects(
    profile: calibration.Profile, rows: list[fd.Prepared]
) -> tuple[list[Effect], list[tuple[fd.Prepared, float, float]]]:
    """Per bucket on the profile's GPU: median |error| without and with the profile; and per row."""
    gpu = profile.gpu_spec
    c = speed.coefficients()
    per_row = []
    for p in rows:
        if p.case.row.gpu != gpu:
            continue
        without = fd.published_ms(p, c) / p.case.row.tpot_ms - 1
        with_ = with_profile_ms(p, profile, c) / p.case.row.tpot_ms - 1
        per_row.append((p, without, with_))
    by: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for p, a, b in per_row:
        by.setdefault(fd.bucket_of(p), []).append((a, b))
    out = [
        Effect(
            key,
            len(v),
            statistics.median(abs(a) for a, _ in v),
            statistics.median(abs(b) for _, b in v),
        )
        for key, v in sorted(by.items())
    ]
    return out, per_row


def all_rows() -> list[fd.Prepared]:
    cases, _ = fd.read_rows()
    return fd.prepare_all(cases)[0]


def main() -> int:
    rows = all_rows()
    bad = 0
    for path, shipped in profiles():
        profile = calibration.load(path)
        table, per_row = effects(profile, rows)
        where = path.relative_to(HERE.parent)
        print(f"\n{where} ({'shipped' if shipped else 'not shipped'}): {profile.device_name}, "
              f"against {len(per_row)} published runs on {profile.gpu_spec}")  # fmt: skip
        print(
            f"{'line':>4} {'engine':<12} {'model':<34} {'batch':>5} {'published':>9} {'fitted':>8} {'profile':>8}"
        )
        for p, a, b in per_row:
            r = p.case.row
            print(f"{r.line:>4} {r.engine[:12]:<12} {r.model[:34]:<34} {r.batch:>5} {r.tpot_ms:>9.2f} "
                  f"{a:>+8.1%} {b:>+8.1%}")  # fmt: skip
        print(f"{'engine':<13} {'kind':<7} {'rows':>4} {'fitted':>8} {'profile':>8}  (median |error|)")
        for e in table:
            _, engine, kind = e.bucket
            flag = "  worse with the profile" if e.worse else ""
            print(
                f"{engine[:13]:<13} {kind:<7} {e.rows:>4} {e.median_without:>8.1%} {e.median_with:>8.1%}{flag}"
            )
        worse = sum(e.worse for e in table)
        verdict = (
            "earns its place" if not worse else f"makes {worse} of {len(table)} buckets worse: must not ship"
        )
        print(f"verdict: {verdict}")
        bad += bool(worse and shipped)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
