"""`estimate --disaggregated` (issue 23): each figure recomputed by hand from the two pools' own plans."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import run_cli
from kvplan.commands import inputs
from kvplan.model.parallel import NETWORKS
from kvplan.plan.plan import estimate
from kvplan.speed.prefill import prefill_time

MODEL, TP, MAX_LEN, IN, OUT = "llama3-8b", "1", "8K", 2048, 256
POOLS = ("--prefill-gpus", "2xH100", "--decode-gpus", "4xH100")
BASE = ("estimate", "-m", MODEL, "-tp", TP, "--max-model-len", MAX_LEN)


def assert_one_line_error(result, code: int, needle: str) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert needle in result.stderr, result.stderr


def _flags(gpus: str, **kw) -> inputs.EstimateFlags:
    return inputs.EstimateFlags(
        model=MODEL, gpus=gpus, tensor_parallel_size=1, max_model_len=MAX_LEN,
        input_len=str(IN), output_len=str(OUT), **kw,
    )  # fmt: skip


def _expected(network: str | None = None) -> dict[str, float]:
    """The figures from the two plans, each pool planned as a plain estimate of its GPUs."""
    p = estimate(inputs.plan_request(_flags("2xH100", network=network)))
    d = estimate(inputs.plan_request(_flags("4xH100", network=network, avg_context=str(IN + OUT))))
    # a request's KV leaves the TP 1 replica that computed it: one GPU's NIC; the 2 replicas send side by side
    link = NETWORKS[network or "400G"].gbps * 1e9 / 8
    kv = IN * p.kv_bytes_per_token
    prefill_s = prefill_time(p.decode.inputs, p.prefill.work, IN, served=False).total_ms / 1e3
    prefill_rate = 2 / prefill_s  # 2 replicas of TP 1
    assert d.avg_context is not None
    conc = d.avg_context.max_concurrency_per_replica  # at input + output tokens
    step_s = d.decode.step(conc, d.decode.kv_bytes_per_request_per_gpu, IN + OUT // 2).tpot_ms / 1e3
    decode_rate = 4 * conc / (OUT * step_s)  # 4 replicas
    return {
        "kv": kv,
        "transfer_ms": kv / link * 1e3,
        "prefill_rate": prefill_rate,
        "prefill_ms": prefill_s * 1e3,
        "conc": 4 * conc,
        "step_ms": step_s * 1e3,
        "decode_rate": decode_rate,
        "ratio": prefill_rate / decode_rate,
    }


@pytest.mark.parametrize("network", [None, "100G"])
def test_json_figures_match_the_two_plans(network):
    extra = ("--network", network) if network else ()
    r = run_cli(
        *BASE, "--disaggregated", *POOLS, "--input-len", str(IN), "--output-len", str(OUT), *extra, "--json"
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert list(out) == ["disaggregated"]
    got = out["disaggregated"]
    want = _expected(network)
    assert got["kv_bytes_per_request"] == pytest.approx(want["kv"])
    assert got["transfer_ms"] == pytest.approx(want["transfer_ms"])
    assert got["transfer_requests_per_s"] == pytest.approx(2 / (want["transfer_ms"] / 1e3))
    assert got["network"] == (network or "400G")
    assert got["prefill"]["replicas"] == 2 and got["decode"]["replicas"] == 4
    assert got["prefill"]["prefill_ms"] == pytest.approx(want["prefill_ms"])
    assert got["prefill"]["requests_per_s"] == pytest.approx(want["prefill_rate"])
    assert got["decode"]["concurrency"] == want["conc"] > 0
    assert got["decode"]["step_ms"] == pytest.approx(want["step_ms"])
    assert got["decode"]["requests_per_s"] == pytest.approx(want["decode_rate"])
    assert got["prefill_to_decode_ratio"] == pytest.approx(want["ratio"])
    binds = "prefill" if want["ratio"] < 1 else "decode"
    assert got["binding_pool"] == binds
    assert got["requests_per_s"] == pytest.approx(min(want["prefill_rate"], want["decode_rate"]))
    assert got["prefill_plan"]["cluster"]["num_gpus"] == 2
    assert got["decode_plan"]["cluster"]["num_gpus"] == 4


def test_printed_section_shows_units_and_the_link_assumption():
    r = run_cli(*BASE, "--disaggregated", *POOLS, "--input-len", str(IN), "--output-len", str(OUT))
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    for needle in ("Disaggregated prefill/decode", "KV moved per request", "GB/s", "req/s", " ms ",
                   "assumed, the default; set --network", "pool binds"):  # fmt: skip
        assert needle in text, needle


def test_estimate_without_the_flag_is_unchanged():
    plain = run_cli(*BASE, "--json").json()
    assert "disaggregated" not in plain


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--disaggregated", *POOLS), "--disaggregated needs --input-len and --output-len"),
        (
            ("--disaggregated", *POOLS, "--input-len", "2K"),
            "--disaggregated needs --input-len and --output-len",
        ),
        (
            ("--disaggregated", "--prefill-gpus", "2xH100", "--input-len", "2K", "--output-len", "1"),
            "--disaggregated needs --prefill-gpus NxGPU and --decode-gpus MxGPU",
        ),  # fmt: skip
        (POOLS, "--prefill-gpus and --decode-gpus need --disaggregated"),
        (
            (
                "--disaggregated",
                "--prefill-gpus",
                "2xNOPE",
                "--decode-gpus",
                "4xH100",
                "--input-len",
                "2K",
                "--output-len",
                "1",
            ),
            "--prefill-gpus",
        ),  # fmt: skip
    ],
)
def test_one_line_errors(args, needle):
    assert_one_line_error(run_cli(*BASE, *args), 2, needle)


def test_same_flags_reach_both_pools():
    p, d = inputs.disaggregated_requests(_flags("H100"), "2xH100", "4xH100")
    assert (p.num_gpus, d.num_gpus) == (2, 4)
    assert dataclasses.replace(p, num_gpus=4, nodes=d.nodes) == dataclasses.replace(
        d, avg_context_tokens=None
    )


@pytest.mark.parametrize(
    ("extra", "flag"),
    [(("--gpus", "8xH100"), "--gpus"), (("--explain",), "--explain")],
)
def test_flags_that_would_be_ignored_are_refused(extra, flag):
    r = run_cli(
        "estimate", "-m", "llama3-8b", "--disaggregated", "--prefill-gpus", "2xH100", "--decode-gpus", "4xH100",
        "--input-len", "1000", "--output-len", "200", *extra,
    )  # fmt: skip
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and flag in r.stderr
