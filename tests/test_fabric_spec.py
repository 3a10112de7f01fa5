"""`deployment.fabric` in a scenario: presets, overrides, kinds, files next to the scenario, the defaults
`build_topology` fills from the chip, one-line errors, and the fabric's effect on `tokenpath simulate`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from cli_helpers import run_cli, simulate_json
from tokenpath.compute.chip import load_chip
from tokenpath.config.errors import UserError
from tokenpath.config.units import parse_bandwidth_Bps, parse_duration_s
from tokenpath.fabric.build import NVLINK_HOP_LATENCY_S, SCALEOUT_LINK_LATENCY_S, build_topology
from tokenpath.fabric.spec import (
    DragonFlyFabric,
    FabricSpec,
    FatTreeFabric,
    FullMeshFabric,
    HierarchyFabric,
    MeshFabric,
    SwitchFabric,
    TorusFabric,
    preset_names,
)
from tokenpath.sim.scenario import build_scenario, load_scenario

SCALEUP = 900e9  # a made-up chip's scale-up bandwidth per direction, so defaults are easy to see
HIERARCHY = {
    "kind": "hierarchy", "nodes": 2,
    "node": {"kind": "switch", "hosts": 4},
    "network": {"kind": "fattree", "k": 4, "levels": 2, "link_bw": "50 GB/s"},
}


def fabric_of(value) -> object:
    return load_scenario("typical", {"deployment.fabric": value}).deployment.fabric


def spec(table: dict):
    return TypeAdapter(FabricSpec).validate_python(table)


def user_error(overrides: dict) -> str:
    with pytest.raises(UserError) as caught:
        load_scenario("typical", overrides)
    message = str(caught.value)
    assert "\n" not in message
    return message


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# -- what deployment.fabric can be -----------------------------------------------------------------

def test_a_preset_name_is_the_whole_table():
    fabric = fabric_of("tpu-v5p-4x4x4")
    assert isinstance(fabric, TorusFabric)
    assert fabric.dims == [4, 4, 4] and fabric.wraparound is True
    assert fabric.link_bw == 100e9 and fabric.link_latency == pytest.approx(1e-6)


def test_a_table_can_start_from_a_preset_and_override_it():
    fabric = fabric_of({"preset": "dgx-h100", "link_bw": "900 GB/s"})
    assert isinstance(fabric, SwitchFabric)
    assert fabric.link_bw == 900e9  # overridden
    assert fabric.hosts == 8 and fabric.nvls is True  # from the preset
    assert fabric_of("dgx-h100").link_bw == 450e9


def test_a_table_without_kind_is_a_switch():
    fabric = fabric_of({"hosts": 4, "link_bw": "100 GB/s", "nvls": False})
    assert isinstance(fabric, SwitchFabric)
    assert (fabric.kind, fabric.hosts, fabric.link_bw, fabric.nvls) == ("switch", 4, 100e9, False)


def test_the_default_scenario_runs_on_one_switch():
    scenario = load_scenario()
    assert isinstance(scenario.deployment.fabric, SwitchFabric)
    assert scenario.deployment.fabric == SwitchFabric()
    assert scenario.deployment.fabric.link_bw is None  # taken from the chip


@pytest.mark.parametrize("table, model", [
    ({"kind": "fullmesh", "hosts": 4}, FullMeshFabric),
    ({"kind": "mesh", "dims": [2, 4]}, MeshFabric),
    ({"kind": "fattree", "k": 4, "link_bw": "50 GB/s"}, FatTreeFabric),
    ({"kind": "dragonfly", "p": 2, "link_bw": "25 GB/s"}, DragonFlyFabric),
    (HIERARCHY, HierarchyFabric),
])
def test_kind_chooses_the_table(table, model):
    assert type(fabric_of(table)) is model


@pytest.mark.parametrize("fabric", [
    {"kind": "torus", "dims": [2, 4], "wraparound": False, "link_bw": "123.5 GB/s", "link_latency": "250 ns",
     "algorithm": "ring"},
    "tpu-v5p-4x4x4",
    "h100-4x8-rail",
    {"kind": "fattree", "k": 4, "levels": 2, "oversubscription": [2.0], "link_bw": "400 Gb/s"},
], ids=["torus", "torus_preset", "hierarchy_preset", "fattree"])
def test_to_toml_round_trips_the_fabric(fabric, tmp_path):
    scenario = load_scenario("typical", {"deployment.fabric": fabric})
    text = scenario.to_toml()
    assert "[deployment.fabric]" in text
    path = write(tmp_path / "round.toml", text)
    back = load_scenario(str(path))
    assert back.deployment.fabric == scenario.deployment.fabric
    assert type(back.deployment.fabric) is type(scenario.deployment.fabric)
    assert back.fingerprint() == scenario.fingerprint()
    assert back.to_toml() == text


def test_to_toml_writes_the_torus_table_in_units():
    text = load_scenario("typical", {"deployment.fabric": "tpu-v5p-4x4x4"}).to_toml()
    table = tomllib.loads(text)["deployment"]["fabric"]
    assert table == {"kind": "torus", "dims": [4, 4, 4], "wraparound": True, "link_bw": "100 GB/s",
                     "link_latency": "1 us", "algorithm": "auto"}


# -- a topology file next to the scenario ----------------------------------------------------------

def test_a_fabric_file_is_read_from_the_scenario_folder_not_the_cwd(tmp_path, monkeypatch):
    folder = tmp_path / "scenarios"
    write(folder / "net.toml", 'description = "two by four"\nkind = "torus"\ndims = [2, 4]\n'
                               'link_bw = "100 GB/s"\n')
    scenario_path = write(folder / "s.toml", '[deployment]\nfabric = "net.toml"\n')
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere / "net.toml", 'kind = "mesh"\ndims = [8]\nlink_bw = "1 GB/s"\n')  # the wrong one
    monkeypatch.chdir(elsewhere)
    for ref in (str(scenario_path), "../scenarios/s.toml"):
        fabric = load_scenario(ref).deployment.fabric
        assert isinstance(fabric, TorusFabric), ref
        assert fabric.dims == [2, 4] and fabric.link_bw == 100e9
    # An absolute path is taken as it is.
    absolute = write(folder / "s2.toml", f'[deployment]\nfabric = "{elsewhere / "net.toml"}"\n')
    assert isinstance(load_scenario(str(absolute)).deployment.fabric, MeshFabric)


def test_a_missing_fabric_file_names_the_path_in_the_scenario_folder(tmp_path, monkeypatch):
    scenario_path = write(tmp_path / "scenarios" / "s.toml", '[deployment]\nfabric = "net.toml"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as caught:
        load_scenario(str(scenario_path))
    message = str(caught.value)
    assert str(tmp_path / "scenarios" / "net.toml") in message and "topology file not found" in message


def test_a_scenario_with_a_fabric_file_simulates_from_another_folder(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "scenarios"
    write(folder / "net.toml", 'kind = "torus"\ndims = [2, 4]\n')
    write(folder / "s.toml", '[deployment]\nfabric = "net.toml"\n[workload]\nnum_requests = 30\n')
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["simulate", "scenarios/s.toml", "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    doc = json.loads(out)
    expected = build_scenario({"deployment": {"fabric": {"kind": "torus", "dims": [2, 4]}},
                               "workload": {"num_requests": 30}}, "x")
    assert doc["scenario"]["fingerprint"] == expected.fingerprint()
    assert doc["attribution_s"]["traffic"] > 0


# -- defaults build_topology fills -----------------------------------------------------------------

def test_a_switch_takes_the_chips_scale_up_bandwidth():
    topology = build_topology(SwitchFabric(), SCALEUP, chips=8)
    assert topology.hosts == 8 and len(topology.links) == 16
    assert np.all(topology.links.bw_Bps == SCALEUP)
    assert np.all(topology.links.latency_s == NVLINK_HOP_LATENCY_S / 2)


def test_the_default_scenario_switch_has_the_h200_nvlink():
    from tokenpath.sim.deployment import build_deployment

    deployment = build_deployment(load_scenario())
    assert deployment.topology.kind == "switch" and deployment.topology.hosts == 8
    assert load_chip("h200").scaleup_bw_Bps == 450e9
    assert np.all(deployment.topology.links.bw_Bps == 450e9)


def test_a_full_mesh_shares_the_scale_up_bandwidth_over_its_peers():
    topology = build_topology(spec({"kind": "fullmesh", "hosts": 8}), SCALEUP)
    assert topology.cables == 8 * 7 // 2
    assert np.allclose(topology.links.bw_Bps, SCALEUP / 7)
    assert np.all(topology.links.latency_s == NVLINK_HOP_LATENCY_S)


@pytest.mark.parametrize("kind", ["torus", "mesh"])
def test_a_torus_or_mesh_shares_it_over_two_ports_per_dimension(kind):
    topology = build_topology(spec({"kind": kind, "dims": [2, 4]}), SCALEUP)
    assert np.allclose(topology.links.bw_Bps, SCALEUP / 4)
    assert np.all(topology.links.latency_s == NVLINK_HOP_LATENCY_S)


@pytest.mark.parametrize("dims", [[8], [2, 4], [4, 2], [2, 2, 2], [3, 2]])
def test_every_chip_of_a_torus_sends_its_whole_scale_up_bandwidth(dims):
    # Each port is cabled, a size-2 dimension's two included, so no chip leaves bandwidth unused.
    topology = build_topology(spec({"kind": "torus", "dims": dims}), SCALEUP)
    sent = np.bincount(topology.links.src, weights=topology.links.bw_Bps, minlength=topology.hosts)
    np.testing.assert_allclose(sent, SCALEUP, rtol=1e-12)
    # A mesh's corner chip has one of its two ports per dimension cabled (a line of 2 is one cable).
    mesh = build_topology(spec({"kind": "mesh", "dims": dims}), SCALEUP)
    assert mesh.links.bw_Bps[mesh.links.src == 0].sum() == pytest.approx(SCALEUP / 2, rel=1e-12)


def test_scale_out_networks_default_to_the_network_hop_latency():
    fattree = build_topology(spec({"kind": "fattree", "k": 4, "link_bw": "50 GB/s"}), SCALEUP)
    assert np.all(fattree.links.bw_Bps == 50e9)  # the chip's scale-up bandwidth does not apply
    assert np.all(fattree.links.latency_s == SCALEOUT_LINK_LATENCY_S)
    assert SCALEOUT_LINK_LATENCY_S == pytest.approx(2.7e-6 / 4)
    dragonfly = build_topology(spec({"kind": "dragonfly", "p": 1, "link_bw": "25 GB/s"}), SCALEUP)
    assert np.all(dragonfly.links.latency_s == SCALEOUT_LINK_LATENCY_S)


@pytest.mark.parametrize("network", [{"kind": "switch", "hosts": 8},
                                     {"kind": "torus", "dims": [2, 4]}, {"kind": "mesh", "dims": [8]}])
def test_a_hierarchys_network_of_any_kind_takes_the_network_hop_latency_not_nvlinks(network):
    """Its links join NICs: a switch, torus or mesh there is no NVLink (0.3 us a switch link)."""
    fabric = spec({"kind": "hierarchy", "nodes": 2, "node": {"kind": "switch", "hosts": 4},
                   "network": {**network, "link_bw": "50 GB/s"}})
    topology = build_topology(fabric, SCALEUP)
    tiers = np.array(topology.tier_names)[topology.links.tier]
    node, net = np.char.startswith(tiers, "node"), np.char.startswith(tiers, "network")
    assert net.sum() > 0 and np.all(topology.links.latency_s[net] == SCALEOUT_LINK_LATENCY_S)
    assert np.all(topology.links.latency_s[node] == NVLINK_HOP_LATENCY_S / 2)


@pytest.mark.parametrize("table", [
    {"kind": "switch", "hosts": 4},
    {"kind": "fullmesh", "hosts": 4},
    {"kind": "torus", "dims": [2, 4]},
    {"kind": "mesh", "dims": [3]},
    {"kind": "fattree", "k": 4},
    {"kind": "dragonfly", "p": 1},
])
def test_explicit_link_bandwidth_and_latency_win(table):
    topology = build_topology(spec({**table, "link_bw": "10 GB/s", "link_latency": "2 us"}), SCALEUP, chips=8)
    assert np.all(topology.links.bw_Bps == 10e9)
    assert np.allclose(topology.links.latency_s, 2e-6)


def test_a_scale_out_network_without_link_bw_is_an_error():
    with pytest.raises(UserError, match="fabric.link_bw: a fattree network needs its link bandwidth"):
        build_topology(spec({"kind": "fattree", "k": 4}), SCALEUP)


def test_a_switch_without_hosts_takes_the_deployments_chips():
    assert build_topology(SwitchFabric(), SCALEUP, chips=16).hosts == 16
    assert build_topology(SwitchFabric(hosts=4), SCALEUP, chips=16).hosts == 4
    with pytest.raises(UserError, match="fabric.hosts"):
        build_topology(FullMeshFabric(), SCALEUP, chips=None)


# -- hierarchies -----------------------------------------------------------------------------------

def test_a_hierarchy_has_node_and_network_sub_tables():
    fabric = fabric_of(HIERARCHY)
    assert isinstance(fabric, HierarchyFabric)
    assert isinstance(fabric.node, SwitchFabric) and fabric.node.hosts == 4
    assert isinstance(fabric.network, FatTreeFabric) and fabric.network.link_bw == 50e9
    assert fabric.rails is True
    topology = build_topology(fabric, SCALEUP)
    assert topology.hosts == 8
    # 2 NVSwitches + a k=4 leaf-spine (4 leaves, 2 spines).
    assert topology.switches == 2 + 6
    tiers = np.array(topology.tier_names)[topology.links.tier]
    node, network = np.char.startswith(tiers, "node"), np.char.startswith(tiers, "network")
    assert node.sum() == 2 * 2 * 4 and node.sum() + network.sum() == len(topology.links)
    # The node takes the chip's scale-up bandwidth; the network keeps its NIC's.
    assert np.all(topology.links.bw_Bps[node] == SCALEUP)
    assert np.all(topology.links.bw_Bps[network] == 50e9)
    assert np.all(topology.links.latency_s[node] == NVLINK_HOP_LATENCY_S / 2)
    assert np.all(topology.links.latency_s[network] == SCALEOUT_LINK_LATENCY_S)


def test_an_unknown_key_inside_node_names_its_path_and_lists_the_switch_keys():
    bad = {**HIERARCHY, "node": {"kind": "switch", "hosts": 4, "nvlink": True}}
    message = user_error({"deployment.fabric": bad})
    assert "unknown key 'deployment.fabric.node.nvlink'" in message
    assert message.split("allowed here: ")[1].split(", ") == list(SwitchFabric.model_fields)
    assert set(SwitchFabric.model_fields) == {"link_bw", "link_latency", "algorithm", "kind", "hosts", "nvls",
                                            "nvls_generation"}


def test_an_unknown_key_inside_network_lists_the_fattree_keys():
    bad = {**HIERARCHY, "network": {**HIERARCHY["network"], "leaves": 4}}
    message = user_error({"deployment.fabric": bad})
    assert "unknown key 'deployment.fabric.network.leaves'" in message
    assert message.split("allowed here: ")[1].split(", ") == list(FatTreeFabric.model_fields)


def test_a_node_cannot_be_a_scale_out_network():
    bad = {**HIERARCHY, "node": {"kind": "fattree", "k": 4}}
    message = user_error({"deployment.fabric": bad})
    assert "deployment.fabric.node" in message and "'fattree'" in message and "'switch'" in message


def test_a_hierarchy_level_link_bandwidth_is_not_silently_ignored():
    # A hierarchy's links belong to its node and network tables: the keys are rejected, not ignored.
    message = user_error({"deployment.fabric": {"preset": "h100-4x8-rail", "link_bw": "1 GB/s"}})
    assert "unknown key 'deployment.fabric.link_bw'" in message
    assert message.endswith("allowed here: algorithm, kind, nodes, node, network, rails")


# -- one-line errors naming the field --------------------------------------------------------------

def test_unknown_kind_lists_the_kinds():
    message = user_error({"deployment.fabric": {"kind": "hypercube"}})
    assert message.startswith("scenario 'typical': deployment.fabric: kind 'hypercube' is not one of")
    for kind in ("switch", "fullmesh", "torus", "mesh", "fattree", "dragonfly", "hierarchy"):
        assert f"'{kind}'" in message


def test_missing_dims_names_the_field():
    message = user_error({"deployment.fabric": {"kind": "torus"}})
    assert "deployment.fabric.dims" in message and "required" in message.lower()


@pytest.mark.parametrize("field, what", [("link_bw", "bandwidth"), ("link_latency", "time")])
def test_a_bad_unit_names_the_field_and_the_unit(field, what):
    message = user_error({"deployment.fabric": {"kind": "torus", "dims": [4], field: "35 parsecs"}})
    assert f"deployment.fabric.{field}" in message
    assert f"unknown {what} unit 'parsecs'" in message and "'35 parsecs'" in message


@pytest.mark.parametrize("value", ["dgx-h1000", {"preset": "dgx-h1000", "hosts": 4}])
def test_an_unknown_preset_lists_the_presets(value):
    message = user_error({"deployment.fabric": value})
    assert "deployment.fabric: unknown preset 'dgx-h1000'" in message
    assert message.split("use one of ")[1].split(", ") == preset_names()


def test_an_unknown_preset_in_a_scenario_names_the_scenario_and_the_field(tmp_path):
    path = write(tmp_path / "s.toml", '[deployment]\nfabric = "dgx-h1000"\n')
    with pytest.raises(UserError) as caught:
        load_scenario(str(path))
    assert str(path) in str(caught.value) and "deployment.fabric" in str(caught.value)


# -- the fabric in a simulation --------------------------------------------------------------------

def test_simulate_on_a_torus_preset_spends_time_in_traffic(monkeypatch, capsys):
    doc = simulate_json(["--fabric", "tpu-v5p-4x4x4", "--chips", "8", "--num-requests", "50"], monkeypatch, capsys)
    expected = load_scenario(None, {"deployment.fabric": "tpu-v5p-4x4x4", "deployment.chips": 8,
                                    "workload.num_requests": 50})
    assert doc["scenario"]["fingerprint"] == expected.fingerprint()
    attribution = doc["attribution_s"]
    assert attribution["traffic"] > 0 and attribution["compute"] > 0
    switch = simulate_json(["--chips", "8", "--num-requests", "50"], monkeypatch, capsys)
    # Eight chips on 100 GB/s torus links all-reduce slower than on a 450 GB/s NVSwitch with NVLS.
    assert attribution["traffic"] > switch["attribution_s"]["traffic"]


def test_spread_placement_on_the_rail_cluster_moves_more_traffic_than_packed(monkeypatch, capsys):
    common = ["--fabric", "h100-4x8-rail", "--chips", "32", "--num-requests", "50"]
    packed = simulate_json(common, monkeypatch, capsys)["attribution_s"]
    spread = simulate_json([*common, "--placement", "spread"], monkeypatch, capsys)["attribution_s"]
    assert packed["traffic"] > 0
    # Spread TP groups cross the 50 GB/s NICs instead of staying on each node's NVSwitch. Small
    # all-reduces are latency-bound either way (NCCL's ring in a node: 15 us), so the gap is in the
    # larger ones.
    assert spread["traffic"] > 1.4 * packed["traffic"]


# -- property: any valid topology table survives TOML and builds the topology it describes -----------

_BANDWIDTHS = st.sampled_from(["25 GB/s", "50 GB/s", "100 GB/s", "400 Gb/s", "1.8 TB/s"])
_LATENCIES = st.sampled_from(["0.3 us", "1 us", "675 ns", "2 us"])


@st.composite
def fabric_tables(draw):
    kind = draw(st.sampled_from(["switch", "fullmesh", "torus", "mesh", "fattree", "dragonfly"]))
    table = {"kind": kind, "link_bw": draw(_BANDWIDTHS), "link_latency": draw(_LATENCIES)}
    if kind in ("switch", "fullmesh"):
        table["hosts"] = draw(st.integers(2, 16))
        expected_hosts = table["hosts"]
    elif kind in ("torus", "mesh"):
        table["dims"] = draw(st.lists(st.integers(2, 5), min_size=1, max_size=3))
        expected_hosts = math.prod(table["dims"])
    elif kind == "fattree":
        table["k"] = 2 * draw(st.integers(1, 4))
        table["levels"] = draw(st.sampled_from([2, 3]))
        table["oversubscription"] = [draw(st.sampled_from([1.0, 1.5, 2.0])) for _ in range(table["levels"] - 1)]
        k = table["k"]
        expected_hosts = k**3 // 4 if table["levels"] == 3 else k * k // 2
    else:
        p = draw(st.integers(1, 2))
        a, h = draw(st.integers(1, 3)), draw(st.integers(1, 2))
        table.update(p=p, a=a, h=h, g=draw(st.integers(2, a * h + 1)))
        expected_hosts = p * a * table["g"]
    return table, expected_hosts


@settings(max_examples=60, deadline=None)
@given(fabric_tables())
def test_any_valid_table_round_trips_through_toml_and_builds_its_hosts(drawn):
    import tomli_w

    table, expected_hosts = drawn
    parsed = spec(table)
    again = spec(tomllib.loads(tomli_w.dumps(parsed.model_dump(mode="json", exclude_none=True))))
    assert again == parsed
    topology = build_topology(parsed)
    assert topology.hosts == expected_hosts
    assert topology.links.bw_Bps.max() <= parse_bandwidth_Bps(table["link_bw"], "link_bw")
    assert set(topology.links.latency_s.tolist()) == {parse_duration_s(table["link_latency"], "link_latency")}
