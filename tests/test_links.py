"""Links from the hardware (issue 21): PCIe cards all-reduce over PCIe, the network is a setting."""

from __future__ import annotations

import pytest

import kvplan
from helpers import plan, run_cli
from kvplan.commands.inputs import parse_network
from kvplan.speed import step_model as speed

MSG = 8192 * 2  # one token's hidden state, bf16: llama3-70b's all-reduce / hop at batch 1


def _per_allreduce(p, tp: int, latency: float, bw: float) -> float:
    return latency + 2 * MSG * (tp - 1) / tp / bw


def test_l40s_tp8_all_reduces_over_pcie_across_sockets():
    p = plan("llama3-70b", "L40S", num_gpus=8, max_model_len=8192, kv_cache_memory_bytes=2**30)
    link = p.decode.inputs.tp_link
    assert not link.inter_node and link.name == "PCIe (across CPU sockets)"
    # 8 cards on a 2-socket host: the ring crosses the CPUs, half the card's PCIe Gen4 32 GB/s
    per = _per_allreduce(p, 8, speed.PCIE_ALLREDUCE_LATENCY_S, 16e9)
    assert p.decode.batch_1.communication_ms == pytest.approx(2 * 80 * per * 1e3)
    # not the fitted NVLink latency
    assert speed.PCIE_ALLREDUCE_LATENCY_S != speed.coefficients().allreduce_latency_s
    assert any("PCIe (across CPU sockets)" in n and "nccl" in n.lower() for n in p.assumptions)


def test_l40s_tp4_stays_behind_one_cpu():
    p = plan("llama3-70b", "L40S", num_gpus=4, max_model_len=8192, kv_cache_memory_bytes=2**30)
    link = p.decode.inputs.tp_link
    assert link.name == "PCIe" and link.bytes_per_s == 32e9
    per = _per_allreduce(p, 4, speed.PCIE_ALLREDUCE_LATENCY_S, 32e9)
    assert p.decode.batch_1.communication_ms == pytest.approx(2 * 80 * per * 1e3)


def test_nvlink_bridge_pairs_cover_tp2_only():
    two = plan("llama3-8b", "H100-PCIe", num_gpus=2, max_model_len=8192)
    four = plan("llama3-8b", "H100-PCIe", num_gpus=4, max_model_len=8192)
    assert two.decode.inputs.tp_link.latency is None  # the fitted NVLink figure
    assert "bridge" in two.decode.inputs.tp_link.name
    assert four.decode.inputs.tp_link.name == "PCIe"
    assert four.decode.inputs.tp_link.latency == speed.PCIE_ALLREDUCE_LATENCY_S


def test_nvswitch_keeps_the_fitted_latency():
    c = speed.coefficients()
    p = plan("llama3-70b", "H100", num_gpus=8, max_model_len=8192)
    link = p.decode.inputs.tp_link
    # NVLink4: "900 GB/s" is both directions; a ring all-reduce streams 450 GB/s each way
    assert link.latency_s(c) == c.allreduce_latency_s and link.bandwidth(c) == 450e9
    assert not any("network" in n or "PCIe" in n for n in p.assumptions)


def test_decode_inputs_json_names_each_link():
    d = plan("llama3-70b", "H100", num_gpus=16, nodes=2, tp=8, pp=2, max_model_len=8192).to_dict()
    inputs = d["decode"]["inputs"]
    assert inputs["tp_link"]["name"] == "NVLink4" and inputs["tp_link"]["inter_node"] is False
    assert [link["name"] for link in inputs["pp_links"]] == ["network 400G"]
    assert inputs["pp_links"][0]["bytes_per_s"] == 50e9
    l40s = plan("llama3-70b", "L40S", num_gpus=8, max_model_len=8192, kv_cache_memory_bytes=2**30).to_dict()
    tp_link = l40s["decode"]["inputs"]["tp_link"]
    assert tp_link["name"] == "PCIe (across CPU sockets)" and tp_link["latency_s"] == 40e-6
    assert "NVIDIA/nccl#1530" in tp_link["source"]


@pytest.mark.parametrize(
    ("network", "bw", "latency"),
    [(None, 50e9, None), ("400G", 50e9, None), ("100G", 12.5e9, None), ("25G", 3.125e9, 50e-6)],
)
def test_network_sets_the_pipeline_hop_across_nodes(network, bw, latency):
    c = speed.coefficients()
    net = parse_network(network)
    p = plan("llama3-70b", "H100", num_gpus=16, nodes=2, tp=8, pp=2, max_model_len=8192, network=net)
    lat = c.network_latency_s if latency is None else latency
    assert p.decode.batch_1.pp_hop_ms == pytest.approx((lat + MSG / bw) * 1e3)
    note = next(n for n in p.assumptions if n.startswith("inter-node network"))
    assert (network or "400G") in note
    assert ("assumed, the default" in note) == (network is None)


def test_explicit_network_figures_and_tp_across_nodes():
    net = parse_network(None, 200, 3)
    assert net is not None and net.bytes_per_s == 25e9 and net.latency_s == 3e-6
    p = plan("llama3-70b", "H100", num_gpus=16, nodes=2, tp=16, max_model_len=8192, network=net)
    link = p.decode.inputs.tp_link
    assert link.inter_node
    # a ring across nodes moves 2 (n - 1) / n x bytes over the slowest link: the network
    per = 3e-6 + 2 * MSG * 15 / 16 / 25e9
    assert p.decode.batch_1.communication_ms == pytest.approx(2 * 80 * per * 1e3)


def test_network_flag_on_every_command_that_crosses_nodes():
    base = ["-m", "llama3-70b", "--max-model-len", "8K"]
    slow = run_cli("estimate", *base, "-g", "2x8xH100", "-pp", "2", "--network", "25G", "--json").json()
    fast = run_cli("estimate", *base, "-g", "2x8xH100", "-pp", "2", "--network", "800G", "--json").json()
    assert slow["decode"]["batch_1"]["pp_hop_ms"] > fast["decode"]["batch_1"]["pp_hop_ms"]
    r = run_cli("estimate", *base, "-g", "2x8xH100", "-pp", "2", "--network", "200G")
    assert "inter-node network 200G" in " ".join(r.stdout.split())
    api = kvplan.estimate("llama3-70b", gpus="2x8xH100", pipeline_parallel_size=2, network="100G")
    assert api.decode.inputs.pp_links[0].name == "network 100G"
    # no compare figure crosses the network (fuzz 28 S2): compare takes no network flag
    table = run_cli("compare", "table", "-m", "llama3-70b", "-g", "2x8xH100", "-pp", "2", "--network", "25G")
    assert table.exit_code == 2 and "No such option: --network" in table.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--network", "300G"], "--network: unknown fabric '300G'"),
        (["--network", "fast"], "use one of 25G, 100G, 200G, 400G, 800G"),
        (["--network-gbps", "0"], "--network-gbps must be 1 to 100,000 Gb/s per GPU, got 0"),
        (["--network-gbps", "nan"], "--network-gbps must be 1 to 100,000 Gb/s per GPU, got nan"),
        (["--network-gbps", "100", "--network-latency-us", "-1"], "--network-latency-us must be between"),
        (["--network-latency-us", "5"], "--network-latency-us goes with --network-gbps"),
        (["--network", "400G", "--network-gbps", "100"], "not both"),
    ],
)
def test_bad_network_values_are_one_line_errors(args, needle):
    for cmd in (["estimate", "-g", "2x8xH100"], ["solve", "--users", "10", "--max-model-len", "8K"]):
        r = run_cli(*cmd, "-m", "llama3-70b", *args)
        assert r.exit_code == 2, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert needle in r.stderr
