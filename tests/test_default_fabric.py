"""The fabric a deployment gets when it names none: the chip's scale-up domain, and beyond it nodes of
that domain on a rail-optimized leaf-spine of the chip's NICs, named in the report."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpath import simulate
from tokenpath.compute import load_chip
from tokenpath.config.errors import UserError
from tokenpath.fabric.build import build_topology, default_fabric
from tokenpath.fabric.spec import load_fabric
from tokenpath.report.simulation import describe
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.document import result_document
from tokenpath.sim.scenario import build_scenario, load_scenario


def deployment(chip: str, chips: int, tp: int = 8, **more):
    return build_deployment(load_scenario(None, {"deployment.chip": chip, "deployment.chips": chips,
                                                 "deployment.tp": tp, **more}))


def test_within_one_domain_the_chips_share_its_switch():
    d = deployment("h100", 8)
    assert (d.topology.kind, d.topology.hosts, d.topology.nvls) == ("switch", 8, True)
    assert d.fabric_name == "one 8-chip switch (default for 8 h100)"


def test_32_h100_get_the_4x8_rail_preset():
    d = deployment("h100", 32)
    preset = build_topology(load_fabric("h100-4x8-rail")[0], load_chip("h100").scaleup_bw_Bps)
    assert d.fabric_name == "4 x 8-chip nodes on 400G rails (default for 32 h100)"
    for field in ("src", "dst", "bw_Bps", "latency_s", "tier"):
        assert np.array_equal(getattr(d.topology.links, field), getattr(preset.links, field)), field
    assert np.array_equal(d.topology.nic, preset.nic)


@pytest.mark.parametrize("chip, chips, nodes, per_node, nic_Bps", [
    ("h100", 16, 2, 8, 50e9), ("h200", 12, 2, 8, 50e9), ("a100", 64, 8, 8, 25e9), ("b200", 24, 3, 8, 50e9),
    ("gb200", 144, 2, 72, 50e9), ("mi300x", 16, 2, 8, 50e9), ("gaudi3", 16, 2, 8, 75e9),
])
def test_beyond_one_domain_nodes_of_it_on_rails_of_its_nics(chip, chips, nodes, per_node, nic_Bps):
    domain = load_chip(chip)
    spec, name = default_fabric(chip, chips, domain.scaleup_domain, domain.scaleup, domain.nic_bw_Bps)
    topology = build_topology(spec, domain.scaleup_bw_Bps, chips)
    assert (topology.kind, topology.nodes, topology.per_node) == ("hierarchy", nodes, per_node)
    assert topology.hosts >= chips and topology.network.hosts >= topology.hosts
    assert name == f"{nodes} x {per_node}-chip nodes on {nic_Bps * 8 / 1e9:g}G rails (default for {chips} {chip})"
    assert set(topology.network.links.bw_Bps) == {nic_Bps}
    # Rail-optimized: NIC i of every node sits on one leaf, so same-rail traffic never crosses a spine.
    leaf_of = topology.network.host_router[topology.nic]
    rails = np.arange(topology.hosts) % per_node
    for rail in range(per_node):
        assert len(set(leaf_of[rails == rail])) == 1


def test_tp16_over_two_h100_nodes_is_not_one_giant_nvswitch(tmp_path):
    """The issue's case: `--chips 16 --tp 16` ran TP16 at full NVLink speed."""
    common = {"deployment.chip": "h100", "deployment.chips": 16, "deployment.tp": 16,
              "workload.num_requests": 60}
    default = simulate(load_scenario(None, common))
    giant = simulate(load_scenario(None, {**common, "deployment.fabric": {"kind": "switch", "hosts": 16}}))
    assert default.deployment.topology.kind == "hierarchy" and giant.deployment.topology.kind == "switch"
    bytes_ = default.deployment.compute.allreduce_bytes(256)
    group = default.deployment.placement.tp_groups()
    across = default.deployment.collectives.time_s("all_reduce", bytes_, group)
    inside = giant.deployment.collectives.time_s("all_reduce", bytes_, group)
    # A 4 MiB all-reduce: over the NICs where the giant switch reduces it in NVLS (39.4 us: its 25 us and
    # the bytes). Across the nodes NCCL's tree under LL128: 14.0 + 2 x (7 x 1.25 + 1 x 4.25) = 40.0 us
    # (tuning.cc; a channel's heads share a rail, so its network step crosses one leaf, 1.35 us of the 2.7
    # through a spine: 8.5 us x 1/2), and the tuner's ceiling, 8 channels x 36.7 GB/s of bus bandwidth x 1/2
    # x .85, at 0.8 of it at this size (treeCorrectionFactor, LL128, log2(4 MiB / 64) = 16): 82.0 us, below
    # NVLSTree's 83.8 (66.8 us and 8 x 57.7 GB/s x 16/30) and the rings' under LL128, 102.0.
    assert default.deployment.collectives.choose("all_reduce", bytes_, group) == "tree"
    assert default.deployment.collectives.protocol("all_reduce", bytes_, group) == "LL128"
    assert giant.deployment.collectives.choose("all_reduce", bytes_, group) == "nvls"
    tree_ll128_s = 40.0e-6 + bytes_ / (8 * 36.7e9 / 2 * 0.85 * 0.8)
    assert tree_ll128_s == pytest.approx(82.02e-6, rel=1e-4)
    assert default.deployment.collectives.time_s("all_reduce", bytes_, group, "nvls_tree") == pytest.approx(
        66.8e-6 + bytes_ / (8 * 57.7e9 * 16 / 30), rel=1e-9)
    assert across == pytest.approx(tree_ll128_s, rel=1e-9) and inside == pytest.approx(39.44e-6, rel=1e-3)
    document = result_document(default)[0]
    assert document["fabric"]["name"] == "2 x 8-chip nodes on 400G rails (default for 16 h100)"
    assert document["fabric"]["kind"] == "hierarchy"
    line = dict(describe(default))["fabric"]
    assert line.startswith("2 x 8-chip nodes on 400G rails (default for 16 h100): hierarchy, 16 hosts")
    assert document["attribution_s"]["traffic"] > result_document(giant)[0]["attribution_s"]["traffic"]


def test_a_given_fabric_is_used_and_named_so():
    d = deployment("h100", 16, **{"deployment.fabric": {"kind": "switch", "hosts": 16}})
    assert (d.topology.kind, d.topology.hosts, d.fabric_name) == ("switch", 16, "switch given in deployment.fabric")


def test_scenario_show_round_trips_to_the_same_default():
    """`scenario show` prints the default fabric table; read back, it still means the chip's default."""
    scenario = load_scenario(None, {"deployment.chip": "h100", "deployment.chips": 32})
    import tomllib
    again = build_scenario(tomllib.loads(scenario.to_toml()), "shown")
    assert build_deployment(again).fabric_name == "4 x 8-chip nodes on 400G rails (default for 32 h100)"


def test_the_chips_own_scale_up_fabric():
    assert not deployment("a100", 8).topology.nvls  # NVSwitch gen 2: no NVLink SHARP
    mi300x = deployment("mi300x", 4, tp=4)
    assert (mi300x.topology.kind, mi300x.topology.hosts) == ("fullmesh", 8)  # xGMI: a link per pair of the 8
    assert mi300x.fabric_name == "one 8-chip fullmesh (default for 4 mi300x)"


@pytest.mark.parametrize("chip, chips, generation", [
    ("a100", 8, "Ampere"), ("a100", 16, "Ampere"), ("a100-40gb", 16, "Ampere"), ("h100", 16, "Hopper"),
    ("h200", 8, "Hopper"), ("b200", 16, "Blackwell"), ("gb200", 144, "Blackwell"), ("mi300x", 8, "CDNA3"),
    ("mi325x", 16, "CDNA3"), ("tpu-v5p", 8, "TPU v5"), ("gaudi3", 16, "Gaudi 3"),
])
def test_the_fabric_takes_its_chips_generation_from_the_catalog(chip, chips, generation):
    """catalog/chips.toml's `generation` is the one place a deployment's fabric takes its chips' generation
    from, the key of the tuner's rows (fabric/tuner.py): its nodes' and, across nodes, the hierarchy's."""
    topology = deployment(chip, chips, **{"model.precision": "bf16"}).topology
    assert topology.generation == generation
    if topology.kind == "hierarchy":
        assert topology.node.generation == generation


def test_a_switch_table_naming_another_generation_than_the_chip_s_is_a_one_line_error():
    fabric = {"kind": "switch", "hosts": 8, "nvls_generation": "Blackwell"}
    with pytest.raises(UserError) as error:
        deployment("h100", 8, **{"deployment.fabric": fabric})
    assert str(error.value) == ("fabric.nvls_generation: 'Blackwell', but the deployment's chips are 'Hopper' "
                                "(catalog/chips.toml); leave it out to take the chip's")
    assert deployment("b200", 8, **{"deployment.fabric": fabric}).topology.nvls_efficiency == 0.74


def test_beyond_a_domain_without_a_nic_in_the_catalog_is_a_one_line_error():
    chip = load_chip("tpu-v6e")
    with pytest.raises(UserError) as error:
        default_fabric("tpu-v6e", 512, chip.scaleup_domain, chip.scaleup, chip.nic_bw_Bps)
    assert str(error.value).startswith("deployment.fabric: 512 tpu-v6e are more than one scale-up domain (256 chips)")
    assert "\n" not in str(error.value)
