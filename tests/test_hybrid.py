"""Hybrid state-space / linear-attention models read from their real config.json files.

State shapes: vLLM vllm/model_executor/layers/mamba/mamba_utils.py (MambaStateShapeCalculator);
block-size raise: vllm/model_executor/models/config.py (HybridAttentionMambaModelConfig);
SGLang's state pool: sglang/srt/model_executor/model_runner_kv_cache_mixin.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import REPO, plan, run_cli
from kvplan.engines.sglang import _mamba_pool, sglang_report
from kvplan.engines.sglang import memory_settings as sglang_memory_settings
from kvplan.formats import KV_DTYPES
from kvplan.model import kv
from kvplan.model.params import param_breakdown
from kvplan.specs.models import FullAttention, NoCache, RecurrentState
from kvplan.specs.registry import load_model
from kvplan.units import GiB

CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"
LOGS = REPO / "tests" / "fixtures" / "logs" / "real"


def model(name: str):
    return load_model(str(CORPUS / f"{name}.json"))


def counts(spec) -> dict[str, int]:
    out: dict[str, int] = {}
    for layer in spec.layers:
        key = type(layer).__name__ if not isinstance(layer, RecurrentState) else layer.mixer
        out[key] = out.get(key, 0) + 1
    return out


def test_qwen3_next_gated_deltanet_state_per_layer():
    spec = model("qwen3-next-80b-a3b-thinking")
    # full_attention_interval 4: 12 attention + 36 Gated DeltaNet layers
    assert counts(spec) == {"gdn": 36, "FullAttention": 12}
    gdn = next(la for la in spec.layers if isinstance(la, RecurrentState))
    resolved = gdn.model_copy(update={"conv_dtype": "bf16", "ssm_dtype": "bf16"})
    # conv: (4 - 1) x (2 x 16 x 128 + 32 x 128 = 8,192) x 2 B = 49,152; SSM: 32 x 128 x 128 x 2 B = 1,048,576
    assert kv.state_parts_per_rank(resolved, tp=1) == (49_152, 1_048_576)
    assert kv.state_parts_per_rank(resolved, tp=2) == (24_576, 524_288)
    # KV per token: 12 layers x 2 heads x 256 x (K + V) x 2 B = 24,576 B (the GDN layers add none)
    assert kv.model_bits_per_token(spec.layers, KV_DTYPES["bf16"]) // 8 == 24_576
    # 79.6B parameters from the architecture (the model card says 80B)
    assert param_breakdown(spec).total == pytest.approx(80e9, rel=0.01)


def test_qwen3_next_vllm_block_size_and_log_lines():
    p = plan(str(CORPUS / "qwen3-next-80b-a3b-thinking.json"), "H200", num_gpus=2, max_model_len=262144)
    # per rank: state 24,576 + 524,288 = 548,864 B; attention 1 KV head x 256 x 2 x 2 B = 1,024 B a token;
    # block 16 x ceil(548,864 / (16 x 1,024)) = 16 x 34 = 544; padding (544 x 1,024 - 548,864) / 548,864
    assert p.settings.block_size == 544
    lines = p.engine.log_lines
    assert lines[0] == (
        "Setting attention block size to 544 tokens to ensure that attention page size is >= mamba page size."
    )
    assert lines[1].startswith("Padding mamba page size by 1.49% ")
    groups = p.engine.details.groups
    # kv_cache_utils: 12 attention and 36 state layers -> group size 12: 1 attention + 3 state groups
    assert sorted((g.kind, g.num_layers) for g in groups) == [("full", 12)] + [("state", 12)] * 3
    # a request: ceil(262,144 / 544) = 482 attention blocks + 2 pages per state group: vLLM 0.28+ turns
    # prefix caching on for hybrid models, in Mamba cache mode 'align' (MambaSpec.max_memory_usage_bytes)
    assert p.engine.details.blocks_per_request == 482 + 3 * 2
    off = plan(
        str(CORPUS / "qwen3-next-80b-a3b-thinking.json"), "H200", num_gpus=2, max_model_len=262144,
        enable_prefix_caching=False,
    )  # fmt: skip
    assert off.engine.details.blocks_per_request == 482 + 3  # mode 'none': one page per state group


def test_qwen3_next_real_vllm_log_reproduced_exactly():
    # vLLM 0.10.2, Qwen3-Next-80B-A3B-Instruct, 2x H200 (tests/fixtures/logs/real/SOURCES.tsv):
    # Available KV cache memory 44.59 GiB -> num_blocks = 44.59 GiB // 557,056 B // 12 = 7,162;
    # GPU KV cache size = 7,162 // 4 groups x 544 = 973,760 tokens; concurrency 7,162 / 485 = 14.77x
    r = run_cli(
        "check-log",
        str(LOGS / "vllm_0.10.2_qwen3-next-80b-a3b_h200_tp2.log"),
        "--model",
        str(CORPUS / "qwen3-next-80b-a3b-thinking.json"),
        "--gpus",
        "H200",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    rows = {row["quantity"]: row for row in r.json()["arithmetic"]}
    assert rows["KV cache tokens"]["log"] == rows["KV cache tokens"]["kvplan"] == 973_760
    assert rows["maximum concurrency"]["log"] == rows["maximum concurrency"]["kvplan"] == 14.77


def test_nemotron_h_56b_attention_layers_state_and_params():
    spec = model("nemotron-h-56b")
    # hybrid_override_pattern: 54 Mamba-2 (M), 10 attention (*), 54 MLP (-) layers
    assert counts(spec) == {"mamba2": 54, "FullAttention": 10, "NoCache": 54}
    # KV per token: 10 layers x 8 KV heads x 128 x (K + V) x 2 B = 40,960 B (not 118 layers' worth)
    assert kv.model_bits_per_token(spec.layers, KV_DTYPES["bf16"]) // 8 == 40_960
    # 56B parameters (the model's name): relu^2 MLPs have two matrices, mixers have no MLP
    assert param_breakdown(spec).total == pytest.approx(56.3e9, rel=0.01)
    m = next(la for la in spec.layers if isinstance(la, RecurrentState))
    fp32 = m.model_copy(update={"conv_dtype": "bf16", "ssm_dtype": "fp32"})
    # conv: 3 x (256 x 64 + 2 x 8 x 256 = 20,480) x 2 B = 122,880; SSM: 256 x 64 x 256 x 4 B = 16,777,216
    assert kv.state_parts_per_rank(fp32, tp=1) == (122_880, 16_777_216)
    # TP 8: 8 groups split (8 % 8 == 0): conv 3 x 2,560 x 2 = 15,360; SSM 32 x 64 x 256 x 4
    assert kv.state_parts_per_rank(fp32, tp=8) == (15_360, 2_097_152)


def test_nemotron_h_vllm_uses_fp32_ssm_state_and_says_so():
    p = plan(str(CORPUS / "nemotron-h-56b.json"), "H200", num_gpus=2, max_model_len=8192)
    # vLLM NemotronH: fp32 SSM when the config states none; block 16 x ceil(8,450,048 / (16 x 2,048)) = 4,128
    # per rank at TP 2: state 61,440 + 8,388,608 = 8,450,048 B, attention 4 heads x 128 x 2 x 2 B = 2,048 B
    assert p.settings.block_size == 4128
    assert any("fp32" in a and "--mamba-ssm-cache-dtype" in a for a in p.assumptions)
    bf16 = plan(
        str(CORPUS / "nemotron-h-56b.json"), "H200", num_gpus=2, max_model_len=8192, mamba_ssm_dtype="bf16"
    )
    # bf16 SSM: 61,440 + 4,194,304 = 4,255,744 B -> 16 x ceil(4,255,744 / 32,768) = 2,080
    assert bf16.settings.block_size == 2080


def test_nemotron3_nano_fits_one_h200():
    p = plan(str(CORPUS / "nemotron-3-nano-30b-a3b.json"), "H200", num_gpus=1, max_model_len=32768)
    # 23 Mamba-2, 23 MoE, 6 attention layers; 31.6B parameters x 2 B = 58.8 GiB of weights, not 190 GiB
    assert counts(load_model(str(CORPUS / "nemotron-3-nano-30b-a3b.json"))) == {
        "mamba2": 23,
        "NoCache": 23,
        "FullAttention": 6,
    }
    assert p.weight_bytes_per_gpu == pytest.approx(58.8 * GiB, rel=0.005)
    # its config states mamba_ssm_cache_dtype float32: no engine default is assumed
    assert not any("default SSM state dtype" in a for a in p.assumptions)
    assert p.max_concurrency > 100


def test_lfm2_short_convolution_layers():
    spec = model("lfm2.5-vl-1.6b")
    assert counts(spec) == {"short_conv": 10, "FullAttention": 6}
    conv = next(la for la in spec.layers if isinstance(la, RecurrentState))
    # conv_L_cache 3: (3 - 1) x conv_dim 2,048 x 2 B = 8,192 B a sequence, no SSM state
    assert kv.state_parts_per_rank(conv.model_copy(update={"conv_dtype": "bf16"}), tp=1) == (8_192, 0)


def test_sglang_state_pool_split_matches_a_real_log():
    # An SGLang log of Qwen3.5-9B at TP 2 (quoted in the engine notes, 2026-04) prints
    #   Mamba Cache is allocated. max_mamba_cache_size: 186, conv_state size: 0.10GB, ssm_state size: 4.38GB
    #   KV Cache is allocated. #tokens: 327310, K size: 2.50 GB, V size: 2.50 GB
    # Per request: 24 GDN layers x (3 x 4,096 x 2 B conv + 16 x 128 x 128 x 4 B fp32 SSM) = 25,755,648 B.
    # The rest memory R those figures imply: 327,310 x 16,384 B (8 layers x 2 heads x 256 x 2 x 2 B)
    # + 186 x 25,755,648 B. kvplan's split of that R gives all four printed figures back.
    spec = model("qwen3.5-9b")
    states = {"conv_dtype": "bf16", "ssm_dtype": "fp32"}
    layers = [la.model_copy(update=states) if isinstance(la, RecurrentState) else la for la in spec.layers]
    rest = 327_310 * 16_384 + 186 * 25_755_648
    pool = _mamba_pool(layers, rest, tp=2)
    assert pool is not None and pool.bytes_per_request == 25_755_648 and pool.slots == 186
    mem = sglang_memory_settings(80 * GiB, 2, 1, 0.85)
    report = sglang_report([layers], KV_DTYPES["bf16"], 2, 1, [rest], 4096, (0, 5), False, 0.8, mem)
    assert report.log_lines[0] == (
        "Mamba Cache is allocated. max_mamba_cache_size: 186, conv_state size: 0.10GB, ssm_state size: 4.38GB"
    )
    assert report.kv_cache_tokens == 327_310
    assert "K size: 2.50 GB, V size: 2.50 GB" in report.log_lines[1]
    # 186 state slots, 3 per running request with the radix cache: 62 requests at most, though
    # 327,310 tokens hold 79.9 requests of 4,096
    assert report.max_concurrency == 62


def test_state_layers_planned_with_sglang_defaults():
    p = plan(str(CORPUS / "qwen3.5-9b.json"), "H100", num_gpus=2, engine="sglang", max_model_len=32768)
    assert p.engine.supported and p.engine.details.mamba_cache_slots > 0
    # the config states mamba_ssm_dtype float32: 24 x (3 x 4,096 x 2 B + 16 x 128 x 128 x 4 B) per rank
    assert p.engine.details.mamba_state_bytes_per_request == 25_755_648
    # without it, SGLang's own default (float32) is said to be an engine default
    q = plan(str(CORPUS / "qwen3-next-80b-a3b-thinking.json"), "H200", num_gpus=4, engine="sglang")
    assert any("SGLang's default --mamba-ssm-dtype is float32" in a for a in q.assumptions)


@pytest.mark.parametrize("model_type", ["falcon_h1", "zamba2", "mamba", "kimi_linear"])
def test_unplannable_hybrids_are_refused_in_one_line(tmp_path: Path, model_type: str):
    import json

    cfg = json.loads((CORPUS / "qwen3-next-80b-a3b-thinking.json").read_text())
    cfg["model_type"] = model_type
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run_cli("estimate", "-m", str(path), "-g", "H200", "--json")
    assert r.exit_code == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "model_type" in r.stderr and "not planned" in r.stderr


def test_yaml_state_layer_fields_are_checked():
    with pytest.raises(ValueError, match="needs state_bytes"):
        RecurrentState(mixer="fixed")
    with pytest.raises(ValueError, match="ssm_dtype"):
        RecurrentState(mixer="gdn", conv_channels=8, conv_kernel=4, ssm_dtype="int8")
    assert FullAttention(num_kv_heads=1, head_dim=8) and NoCache()


def test_nemotron3_latent_moe_parameter_counts():
    # moe_latent_size: routed experts work in a 1,024 (Super) / 2,048 (Ultra) wide space with
    # fc1/fc2 latent projections; relu^2 experts have two matrices. The names say 120B and 550B.
    super_ = load_model(str(CORPUS / "nemotron-3-super-120b-a12b-fp8" / "config.json"))
    ultra = model("nemotron-3-ultra-550b-a55b")
    assert super_.moe.expert_hidden_size == 1024 and ultra.moe.expert_hidden_size == 2048
    # one routed expert of Super: 2 x 1,024 x 2,688 = 5,505,024 parameters (not 2 x 4,096 x 2,688)
    assert param_breakdown(super_).total == pytest.approx(120e9, rel=0.01)
    assert param_breakdown(ultra).total == pytest.approx(550e9, rel=0.01)
    # Nano has no latent space: 31.6B parameters (its model card: 31.6B total)
    assert param_breakdown(model("nemotron-3-nano-30b-a3b")).total == pytest.approx(31.6e9, rel=0.005)


@pytest.mark.parametrize(
    ("shipped", "config"),
    [
        ("qwen3-next", "qwen3-next-80b-a3b-thinking.json"),
        ("qwen3.5", "qwen3.5-397b-a17b.json"),
        ("qwen3.5-9b", "qwen3.5-9b.json"),
        ("nemotron-h", "nemotron-h-56b.json"),
        ("kimi-k2.5", "kimi-k2.5.json"),
    ],
)
def test_shipped_spec_is_what_its_config_gives(shipped, config):
    ship, read = load_model(shipped), load_model(str(CORPUS / config))
    assert [la.model_dump() for la in ship.layers] == [la.model_dump() for la in read.layers]
    assert [ship.mlp_kind(i) for i in range(ship.num_layers)] == [
        read.mlp_kind(i) for i in range(read.num_layers)
    ]
    assert (ship.moe, ship.max_context, ship.vocab_size) == (read.moe, read.max_context, read.vocab_size)
    assert param_breakdown(ship).total == param_breakdown(read).total
    a = plan(shipped, "H200", num_gpus=8, max_model_len=8192)
    b = plan(str(CORPUS / config), "H200", num_gpus=8, max_model_len=8192)
    assert (a.weight_bytes_per_gpu, a.kv_bytes_per_request, a.engine.log_lines) == (
        b.weight_bytes_per_gpu,
        b.kv_bytes_per_request,
        b.engine.log_lines,
    )


def test_compare_table_shows_state_per_request_beside_kv():
    r = run_cli(
        "compare", "table", "--models", "qwen3.5-9b,qwen3-8b,qwen3-next", "--context", "128K", "-g", "8xH200",
        "--json",
    )  # fmt: skip
    rows = {row["model"]: row for row in r.json()["rows"]}
    # Qwen3.5-9B (config: fp32 SSM): 24 x (3 x 8,192 x 2 B + 32 x 128 x 128 x 4 B) = 51,511,296 B a request
    assert rows["qwen3.5-9b"]["state_bytes_per_request"] == 51_511_296
    # Qwen3-Next under vLLM (bf16 state): 36 x (49,152 + 1,048,576) = 39,518,208 B
    assert rows["qwen3-next-80b-a3b"]["state_bytes_per_request"] == 39_518_208
    assert rows["qwen3-8b"]["state_bytes_per_request"] == 0
    # KV per request: 8 attention layers x 4 heads x 256 x 2 x 2 B x 131,072 tokens + the state
    assert rows["qwen3.5-9b"]["kv_bytes_per_request"] == 8 * 4 * 256 * 2 * 2 * 131_072 + 51_511_296
    text = run_cli(
        "compare", "table", "--models", "qwen3.5-9b,qwen3-8b", "--context", "128K", "--format", "csv"
    )
    assert "state_bytes_per_request" in text.stdout.splitlines()[0]
    plain = run_cli("compare", "table", "--models", "qwen3-8b,llama3-8b", "--format", "csv")
    assert "state_bytes_per_request" not in plain.stdout  # no state: no column


def test_jamba_attention_period_mamba1_state_and_expert_layers():
    # a Jamba-v0.1 config reduced by its repository for tests (4 layers; SOURCES.tsv says so):
    # attn_layer_period 4, offset 2 -> layer 2 attends, layers 0, 1, 3 are Mamba-1;
    # expert_layer_period 2, offset 1 -> layers 1 and 3 are MoE
    spec = model("jamba-v0.1-reduced-test")
    assert [type(la).__name__ for la in spec.layers] == [
        "RecurrentState",
        "RecurrentState",
        "FullAttention",
        "RecurrentState",
    ]
    assert [spec.mlp_kind(i) for i in range(4)] == ["dense", "moe", "dense", "moe"]
    m = next(la for la in spec.layers if isinstance(la, RecurrentState))
    # mamba1: intermediate = mamba_expand 2 x hidden 2,048 = 4,096; conv (d_conv 1 - 1 = 0 rows);
    # SSM 4,096 x d_state 4 x 2 B = 32,768 B a sequence per layer
    assert kv.state_parts_per_rank(m.model_copy(update={"conv_dtype": "bf16", "ssm_dtype": "bf16"})) == (
        0,
        32_768,
    )
    # KV per token: 1 layer x 8 heads x 256 x 2 x 2 B
    assert kv.model_bits_per_token(spec.layers, KV_DTYPES["bf16"]) // 8 == 8_192


def test_kimi_k3_refused_in_one_line_saying_why(tmp_path: Path):
    """Issue 24: a Kimi-K3-style config (KDA layers with MLA) stopped on a missing MoE field."""
    import json

    cfg = {
        "model_type": "kimi_k3",
        "architectures": ["KimiK3ForCausalLM"],
        "text_config": {
            "num_hidden_layers": 48,
            "hidden_size": 2304,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "vocab_size": 163840,
            "max_position_embeddings": 131072,
            "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4]},
            "num_experts": 256,
        },
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run_cli("estimate", "-m", str(path), "-g", "H200")
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "KDA" in lines[0] and "not planned" in lines[0], lines
