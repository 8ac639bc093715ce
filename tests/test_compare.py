"""`kvplan compare`: variants as spec transformations, the README's comparisons, the ladder, formats, charts."""

from __future__ import annotations

import csv
import io
import json
import sys
import xml.etree.ElementTree as ET

import pytest

from helpers import run_cli
from kvplan.errors import UsageError
from kvplan.plan.plan import PlanRequest
from kvplan.search import compare
from kvplan.specs.registry import load_gpu, load_model
from kvplan.units import GiB, KiB


def base(model="llama2-7b", gpu="H100", n=1, **kw) -> PlanRequest:
    return PlanRequest(model=load_model(model), gpu=load_gpu(gpu), num_gpus=n, **kw)


def test_seed001_cross_model_ratios():
    # DeepSeek-V2, arXiv:2405.04434: 405B 516 KB, Qwen2.5-72B 327 KB, DeepSeek-V3 70 KB per token: ~7x and ~5x
    j = run_cli(
        "compare", "table", "--models", "llama3.1-405b,qwen2.5-72b,deepseek-v3", "--format", "json"
    ).json()
    per_token = {r["model"]: r["kv_bytes_per_token"] for r in j["rows"]}
    assert per_token == {"llama3.1-405b": 516096, "qwen2.5-72b": 327680, "deepseek-v3": 70272}
    assert per_token["llama3.1-405b"] / per_token["deepseek-v3"] == pytest.approx(7.34, abs=0.01)
    assert per_token["qwen2.5-72b"] / per_token["deepseek-v3"] == pytest.approx(4.66, abs=0.01)
    assert j["schema"] == "kvplan.compare/1" and j["kind"] == "table"
    assert j["cluster"]["num_gpus"] == 8 and j["cluster"]["max_model_len"] == 8192


@pytest.mark.parametrize(
    ("variant", "per_token"),
    [
        # Llama-2-7B: 32 layers x 32 heads x 128, bf16 = 512 KiB per token (MHA)
        ("shipped", 512 * KiB),
        ("mha", 512 * KiB),
        ("gqa8", 128 * KiB),  # 8 KV heads: 1/4
        ("mqa", 16 * KiB),  # 1 KV head: 1/32
        ("mla512", 32 * 576 * 2),  # one 512 + 64 latent per layer
        ("share2", 256 * KiB),  # every second layer reads its neighbour's KV
        ("int8", 256 * KiB),
        ("int4", 512 * KiB * 4.5 / 16),  # 4 bits + fp16 scale and zero per 64 values = 4.5 bits
        ("int2", 512 * KiB * 2.5 / 16),
        ("gqa8+int8", 64 * KiB),  # composed
        ("mqa+int4", 16 * KiB * 4.5 / 16),
    ],
)
def test_variants_transform_the_spec(variant, per_token):
    r = compare.row(base(max_model_len=4096), load_model("llama2-7b"), variant)
    assert r.error is None
    assert r.kv_bytes_per_token == per_token
    assert r.ratio_to_mha == pytest.approx(per_token / (512 * KiB))


def test_mla_model_ratio_to_its_mha_equivalent():
    # DeepSeek-V3's MHA equivalent: 128 heads x (192 K + 128 V) x 2 B x 61 layers
    r = compare.row(base("deepseek-v3", "H200", 8, max_model_len=8192), load_model("deepseek-v3"), "shipped")
    assert r.ratio_to_mha == pytest.approx(70272 / (128 * 320 * 2 * 61))


def test_window_variant_caps_the_request():
    spec = load_model("llama3.1-8b")
    full = compare.row(base("llama3.1-8b", max_model_len=32768), spec, "shipped")
    win = compare.row(base("llama3.1-8b", max_model_len=32768), spec, "window4096")
    assert win.kv_bytes_per_request == full.kv_bytes_per_request // 8  # 4,096 of 32,768 tokens kept
    assert win.max_concurrency > 7 * full.max_concurrency


def test_offload_tier_adds_capacity_and_pcie_time():
    b = base("llama3-8b", max_model_len=8192, kv_cache_memory_bytes=10 * GiB)
    spec = load_model("llama3-8b")
    plain = compare.row(b, spec, "shipped")
    off = compare.row(b, spec, "offload10")
    # pool: (5,120 - 1) blocks x 2 MiB on the GPU + 10 GiB of CPU memory; 1 GiB per request
    assert plain.max_concurrency == (5120 - 1) // 512 == 9
    assert off.max_concurrency == ((5120 - 1) * 2 * 2**20 + 10 * GiB) // GiB == 19
    spilled = 19 * GiB - (5120 - 1) * 2 * 2**20
    assert off.offload_read_ms == pytest.approx(spilled / load_gpu("H100").pcie_bytes_per_s * 1e3)
    assert "PCIe" in off.quality


def test_bad_variants_are_one_line_errors():
    r = run_cli("compare", "table", "--models", "llama2-7b", "--variants", "gqa8+zip")
    assert r.exit_code == 2 and "unknown 'zip'" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("compare", "table", "--models", "llama2-7b", "--variants", "gqa5")
    assert r.exit_code == 2 and "must divide" in r.stderr
    with pytest.raises(UsageError):
        compare.make_variant(load_model("llama2-7b"), "share1")


def test_infeasible_row_keeps_the_table():
    j = run_cli(
        "compare", "table", "--models", "llama3.1-405b,llama3-8b", "-g", "1xH100", "--format", "json"
    ).json()
    by = {r["model"]: r for r in j["rows"]}
    assert by["llama3.1-405b"]["error"] and by["llama3.1-405b"]["max_concurrency"] is None
    assert by["llama3-8b"]["max_concurrency"] > 0
    assert any("llama3.1-405b" in n for n in j["notes"])


def test_ladder_reproduces_seed_000_15_8():
    # the worked example's own assumptions (README, A worked example): ~50 GiB of KV per GPU, requests averaging 8K (here with up to 16K
    # preallocated by the naive baseline), a 6K-token prefix shared by 50% of requests
    j = run_cli(
        "compare",
        "ladder",
        "-m",
        "llama3.1-70b",
        "-g",
        "8xH100",
        "--max-model-len",
        "16K",
        "--avg-context",
        "8K",
        "--kv-cache-memory",
        "50GiB",
        "--shared-prefix-tokens",
        "6K",
        "--format",
        "json",
    ).json()
    steps = {s["step"]: s for s in j["steps"]}
    conc = [s["max_concurrency"] for s in j["steps"]]
    assert 10 <= steps["naive PyTorch"]["max_concurrency"] <= 20  # README, A worked example: 10-20
    assert steps["+ PagedAttention"]["factor"] == pytest.approx(2.0, rel=0.06)  # 16K reserved, 8K used
    assert (
        steps["+ GQA"]["max_concurrency"] == 159
    )  # README, A worked example: 400 GiB / 2.5 GiB = 160 (one null block)
    assert steps["+ GQA"]["factor"] == pytest.approx(8, rel=0.05)  # 64 query heads, 8 KV heads
    assert steps["+ INT8 KV"]["factor"] == pytest.approx(2.0, rel=0.01)  # README, A worked example: ~300
    assert 1.5 <= steps["+ prefix caching"]["factor"] <= 2.0  # README, A worked example: "1.5-2x", ~500
    assert steps["+ MLA + FP8"]["max_concurrency"] >= 1000  # README, A worked example: "~1000+"
    assert conc == sorted(conc)
    assert steps["+ MLA + FP8"]["cumulative"] == pytest.approx(conc[-1] / conc[0])
    assert j["kv_budget_bytes_per_gpu"] == 50 * GiB


def test_ladder_defaults_and_mla_replication_note():
    r = run_cli("compare", "ladder")
    assert (
        r.exit_code == 0
        and "the ladder (README, Comparing models and techniques)" in r.stdout
        and "same KV budget" in r.stdout
    )
    j = run_cli("compare", "ladder", "--format", "json").json()
    # llama3-70b, 8K, half of it held on average, 3/4 of that shared by half the requests
    assert (j["max_model_len"], j["avg_context_tokens"], j["shared_prefix_tokens"]) == (8192, 4096, 3072)
    last = j["steps"][-1]
    assert "data-parallel attention" in last["how"] and "replicated on every TP rank" in last["how"]
    bad = run_cli("compare", "ladder", "--avg-context", "16K")
    assert bad.exit_code == 2 and "--avg-context" in bad.stderr


def test_formats_md_csv_json():
    args = [
        "compare",
        "table",
        "--models",
        "llama3-8b,mistral-7b-v0.3",
        "-g",
        "1xH100",
        "--variants",
        "shipped,int8",
    ]
    md = run_cli(*args, "--format", "md").stdout
    assert "| model | variant | KV/token |" in md and md.count("\n| llama3-8b |") == 2
    rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--format", "csv").stdout)))
    assert len(rows) == 4 and rows[1]["variant"] == "int8" and int(rows[0]["kv_bytes_per_token"]) == 131072
    j = json.loads(run_cli(*args, "--format", "json").stdout)
    assert set(j["rows"][0]) >= {
        "model",
        "variant",
        "kv_bytes_per_token",
        "ratio_to_mha",
        "kv_bytes_per_request",
        "max_concurrency",
        "decode_kv_read_ms",
        "quality",
        "error",
        "decode_kv_read_source",
    }
    # the KV-read columns are bytes over the datasheet bandwidth, and say so in the header and in JSON
    assert j["rows"][0]["decode_kv_read_source"].startswith("datasheet HBM bandwidth")
    assert "| KV read/step, all (datasheet BW) |" in md
    assert run_cli(*args, "--format", "xml").exit_code == 2


def test_plot_writes_decodable_png_and_svg(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    png = tmp_path / "c.png"
    r = run_cli("compare", "plot", "--models", "llama3-8b,llama2-7b", "-g", "1xH100", "-o", str(png))
    assert r.exit_code == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(png)
    assert img.shape[0] > 200 and img.shape[1] > 400
    assert "1K" in r.stdout and "Max concurrent requests vs context" in r.stdout
    svg = tmp_path / "c.svg"
    assert run_cli("compare", "plot", "--models", "llama3-8b", "-g", "1xH100", "-o", str(svg)).exit_code == 0
    assert ET.parse(svg).getroot().tag.endswith("svg")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    bad = run_cli("compare", "plot", "-o", str(tmp_path / "c.jpg"))
    assert bad.exit_code == 2 and ".png or .svg" in bad.stderr


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = run_cli("compare", "plot", "--models", "llama3-8b", "-g", "1xH100", "-o", str(tmp_path / "c.png"))
    assert r.exit_code == 2 and "pip install 'kvplan[plot]'" in r.stderr


def test_terminal_curve_halves_as_context_doubles():
    ctxs = compare.contexts(8192)
    assert ctxs == [1024, 2048, 4096, 8192]
    ys = compare.curve(
        base("llama3-8b", kv_cache_memory_bytes=20 * GiB), load_model("llama3-8b"), "shipped", ctxs
    )
    # 10,240 blocks of 2 MiB, minus the null block: 10,239 // 64, // 128, // 256, // 512
    assert ys == [10239 // 64, 10239 // 128, 10239 // 256, 10239 // 512]


def test_chart_context_labels_never_collide():
    from kvplan.render.chart import tick_contexts

    # doubling contexts up to DeepSeek-V3's 163,840: 128K and 160K are too close to both be labelled
    ctxs = [1024 * 2**i for i in range(8)] + [163_840]
    ticks = tick_contexts(ctxs)
    assert ticks[-1] == 163_840 and 131_072 not in ticks
    assert all(b >= 1.5 * a for a, b in zip(ticks, ticks[1:], strict=False))
    assert tick_contexts([1024, 2048, 4096]) == [1024, 2048, 4096]


def test_infeasible_row_keeps_its_kv_per_token_and_says_why():
    r = run_cli("compare", "table", "--models", "llama3-70b", "-g", "H100", "--json")
    row = r.json()["rows"][0]
    # 80 layers x 8 KV heads x 128 x (K + V) x 2 B = 327,680 B a token, whether or not it fits one H100
    assert row["error"] and row["kv_bytes_per_token"] == 327_680 and row["max_concurrency"] is None
    assert any("weights need" in n for n in r.json()["notes"])
