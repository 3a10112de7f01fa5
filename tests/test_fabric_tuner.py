"""NCCL's tuner's factors and ceilings (fabric/tuner.py) against src/graph/tuning.cc (NCCL 5067397), and how a
group across nodes reaches them: channels, generation, assumptions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.compute.chip import load_chip
from tokenpath.config.assumptions import Assumptions
from tokenpath.fabric.build import build_topology
from tokenpath.fabric.collectives import Collectives
from tokenpath.fabric.fattree import FatTree
from tokenpath.fabric.hierarchy import Hierarchy
from tokenpath.fabric.single_hop import FullMesh, Switch
from tokenpath.fabric.tuner import (
    LL_MAX_BUS_BW_MORE_NODES_BPS,
    LL_MAX_BUS_BW_ONE_NODE_BPS,
    LL_MAX_BUS_BW_TWO_NODES_BPS,
    NCCL_COMPUTE_CAPABILITY,
    PER_CHANNEL_MAX_BUS_BW_BPS,
    PROTOCOLS,
    RING_SIMPLE_LATENCY_PLATEAU,
    TREE_ALL_REDUCE_EFFICIENCY,
    TREE_CORRECTION,
    TREE_SAME_GPU_NIC_EFFICIENCY,
    Span,
    Tuner,
    corrected_bytes,
    correction,
)
from tokenpath.sim.deployment import chip_fabric

LL, LL128, SIMPLE = PROTOCOLS
REL = 1e-12


def test_constants_are_tuning_cc_s():
    # "Various model refinements": tree all-reduce x .92; x .85 for NCCL_TOPO_PATTERN_TREE; llMaxBws Intel-N2,
    # Intel-N4; ncclTopoGetAlgoTime: Simple ring x 1.4 from compute capability 8.0.
    assert (TREE_ALL_REDUCE_EFFICIENCY, TREE_SAME_GPU_NIC_EFFICIENCY, RING_SIMPLE_LATENCY_PLATEAU) == (0.92, 0.85, 1.4)
    assert (LL_MAX_BUS_BW_TWO_NODES_BPS, LL_MAX_BUS_BW_MORE_NODES_BPS) == (39.0e9, 20.4e9)
    # perChMaxTreeBws, perChMaxTreeLL128Bws, perChMaxRingLL128Bws, perChMaxNVLSTreeBws: the N2 and N4 columns.
    assert PER_CHANNEL_MAX_BUS_BW_BPS["Hopper"] == {("tree", "any"): (41.4e9, 36.0e9),
                                                    ("tree", "LL128"): (36.7e9, 29.0e9),
                                                    ("ring", "LL128"): (36.7e9, 36.7e9),
                                                    ("nvls_tree", "Simple"): (57.7e9, 45.5e9)}
    assert [len(row) for row in TREE_CORRECTION.values()] == [24, 24, 24]
    # 1 MiB: log2(2^20 / 64) = 14
    assert [TREE_CORRECTION[p][14] for p in ("LL", "LL128", "Simple")] == [0.5, 0.6, 0.5]


@pytest.mark.parametrize("size, index", [(64, 0), (127, 0), (128, 1), (2**10, 4), (2**20, 14), (2**28, 22),
                                         (2**29 - 1, 22), (2**29, 23)])
def test_a_size_reads_the_correction_at_log2_of_its_64_byte_chunks(size, index):
    row = tuple(float(i) for i in range(1, 25))  # entry i is i + 1
    assert correction(row, size) == index + 1
    assert correction(row[:23], size) == (index + 1 if index < 23 else 1.0)  # the tree's 23 entries


def test_below_64_bytes_and_past_the_table_a_tree_reaches_its_whole_bandwidth():
    assert correction(TREE_CORRECTION["LL"], 63) == 1.0
    assert correction(TREE_CORRECTION["Simple"][:23], 2**30) == 1.0


def test_a_trees_share_is_nccls_at_each_power_of_two_and_on_the_line_between():
    row = TREE_CORRECTION["LL128"]  # 2 to 4 MiB: 0.6; from 4 MiB: 0.8
    assert corrected_bytes(row, 2**22) == pytest.approx(2**22 / 0.8, rel=REL)
    assert corrected_bytes(row, 2**21) == pytest.approx(2**21 / 0.6, rel=REL)
    three = 3 * 2**20  # log2(3 MiB / 2 MiB) = 0.585 of the way
    assert corrected_bytes(row, three) == pytest.approx(three / (0.6 + 0.2 * np.log2(1.5)), rel=REL)
    assert corrected_bytes(row, 2**22 - 1) == pytest.approx(2**22 / 0.8, rel=1e-6)  # was 2**22 / 0.6
    assert corrected_bytes(row, 63) == 63


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 2**31), min_size=2, max_size=2, unique=True),
       protocol=st.sampled_from(sorted(TREE_CORRECTION)), entries=st.sampled_from([23, 24]))
def test_a_larger_message_never_takes_a_tree_less_time(sizes, protocol, entries):
    small, large = sorted(sizes)
    row = TREE_CORRECTION[protocol][:entries]
    assert corrected_bytes(row, small) <= corrected_bytes(row, large)


@pytest.mark.parametrize("generation, nic_Bps, rails, ring_channels, nvls_channels", [
    ("Hopper", 50e9, 8, 8, 8), ("Hopper", 50e9, 5, 5, 5), ("Hopper", 50e9, 4, 8, 4), ("Hopper", 50e9, 1, 2, 1),
    ("Blackwell", 50e9, 8, 8, 8), ("Blackwell", 50e9, 4, 8, 4),
    ("Blackwell", 100e9, 8, 16, 8),  # 800G: 96 GB/s a channel, doubled to 16 of 48
    ("Ampere", 50e9, 8, 16, 8),  # 8.0 is not past 8.0: 48 GB/s channels double however many
    ("Ampere", 25e9, 8, 8, 8), ("Ampere", 25e9, 2, 2, 2),  # 200G: 24 GB/s, under 25, never doubled
])
def test_channels_are_one_per_rail_doubled_as_nccl_doubles_them(generation, nic_Bps, rails, ring_channels,
                                                                 nvls_channels):
    # search.cc: a channel over one NIC runs at the fastest of the search's speeds the NIC carries
    # (speedArrayInter, sm90SpeedArrayInter, sm100SpeedArrayInter), and ncclTopoDupChannels doubles channels of
    # 25 GB/s and more, except past compute capability 8.0 more than 4 of under 50 GB/s; NVLS graphs never.
    span = Span(nodes=2, ranks=2 * rails, rails=rails, generation=generation, nic_Bps=nic_Bps)
    assert (span.channels("ring"), span.channels("tree"), span.channels("nvls_tree")) == \
        (ring_channels, ring_channels, nvls_channels)


def test_inside_a_node_the_tree_takes_its_efficiency_and_nothing_else():
    tuner = Tuner()
    assert tuner.bandwidth_Bps("tree", "all_reduce", SIMPLE, 100e9, 1, None) == pytest.approx(92e9, rel=REL)
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL128, 100e9, 1, None) == pytest.approx(92e9 * 7 / 9,
                                                                                                 rel=REL)
    assert tuner.bandwidth_Bps("ring", "all_reduce", LL, 100e9, 1, None) == pytest.approx(50e9, rel=REL)
    assert tuner.bandwidth_Bps("nvls_tree", "all_reduce", SIMPLE, 100e9, 2, None) == 100e9


def test_across_nodes_the_ceilings_bind_in_the_tuner_s_order():
    tuner = Tuner()
    span = Span(nodes=4, ranks=32, rails=8, generation="Hopper", nic_Bps=50e9)
    fast = 1e12  # links faster than every ceiling
    # Tree: min(x .92, 8 x 36.0 GB/s), then LL128's min(x 120/128, 8 x 29.0), x .85, as bus bandwidth; x 1/2.
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL128, fast, span.nodes, span) == pytest.approx(
        8 * 29.0e9 * 0.85 / 2, rel=REL)
    assert tuner.bandwidth_Bps("tree", "all_reduce", SIMPLE, fast, span.nodes, span) == pytest.approx(
        8 * 36.0e9 * 0.85 / 2, rel=REL)
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL, fast, span.nodes, span) == pytest.approx(
        20.4e9 * 0.85 / 2, rel=REL)
    # The ring: LL's ceiling and LL128's per channel, x nRanks / nsteps of the op (all-gather: 32 / 31).
    assert tuner.bandwidth_Bps("ring", "all_reduce", LL, fast, span.nodes, span) == pytest.approx(
        20.4e9 * 32 / 62, rel=REL)
    assert tuner.bandwidth_Bps("ring", "all_gather", LL128, fast, span.nodes, span) == pytest.approx(
        8 * 36.7e9 * 32 / 31, rel=REL)
    assert tuner.bandwidth_Bps("ring", "all_gather", SIMPLE, fast, span.nodes, span) == fast
    assert tuner.bandwidth_Bps("nvls_tree", "all_reduce", SIMPLE, fast, span.nodes, span) == pytest.approx(
        8 * 45.5e9 * 32 / 62, rel=REL)
    # Slow links: the physical rate binds, the protocol's share and the tree's factors still apply.
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL128, 100e9, span.nodes, span) == pytest.approx(
        100e9 * 0.92 * 120 / 128 * 0.85, rel=REL)


def test_the_latency_plateau_is_a_simple_ring_all_reduce_s_across_nodes():
    tuner = Tuner()
    span = Span(nodes=2, ranks=16, rails=8, generation="Hopper", nic_Bps=50e9)
    assert tuner.latency_factor("ring", "all_reduce", SIMPLE, span) == 1.4
    assert tuner.latency_factor("ring", "all_gather", SIMPLE, span) == 1.0
    assert tuner.latency_factor("ring", "all_reduce", LL128, span) == 1.0
    assert tuner.latency_factor("tree", "all_reduce", SIMPLE, span) == 1.0
    assert tuner.latency_factor("ring", "all_reduce", SIMPLE, None) == 1.0


def nodes_of_8(nodes: int, generation: str = "Hopper", link_bw: float = 450e9, nic_bw: float = 50e9) -> Hierarchy:
    return Hierarchy(nodes, Switch(8, link_bw, 0.3e-6, generation=generation), Switch(8 * nodes, nic_bw, 1.35e-6))


def test_the_ampere_rows_are_tuning_cc_s():
    # compCapIndex 1 (compute capability 8.0, the A100's): perChMaxTreeBws {24.0, 23.6, 17.8},
    # perChMaxTreeLL128Bws and perChMaxRingLL128Bws {20.0, 20.0, 20.0}, perChMaxNVLSTreeBws {24.0, 23.6, 17.8}:
    # the N2 and N4 columns.
    assert NCCL_COMPUTE_CAPABILITY == {"Ampere": 80, "Hopper": 90, "Blackwell": 100}
    assert PER_CHANNEL_MAX_BUS_BW_BPS["Ampere"] == {("tree", "any"): (23.6e9, 17.8e9),
                                                    ("tree", "LL128"): (20.0e9, 20.0e9),
                                                    ("ring", "LL128"): (20.0e9, 20.0e9),
                                                    ("nvls_tree", "Simple"): (23.6e9, 17.8e9)}


@pytest.mark.parametrize("nodes, tree_GBps, tree_ll128_GBps, ring_ll128_GBps", [
    (2, 23.6, 20.0, 20.0),  # Ampere-N2
    (4, 17.8, 20.0, 20.0),  # Ampere-N4
])
def test_a100_nodes_take_ampere_s_ceilings(nodes, tree_GBps, tree_ll128_GBps, ring_ll128_GBps):
    # 8 A100s a node, a 200G NIC each: 8 channels of 24 GB/s (never doubled), each under Ampere's ceilings, in the
    # tuner's order: the tree's x.92 then its ceiling, LL128's x120/128 then its ceiling, x.85; x1/2 for the
    # tree's algorithm bandwidth, nRanks / nsteps for the ring's.
    tuner, ranks, fast = Tuner(), 8 * nodes, 1e12
    span = Span(nodes=nodes, ranks=ranks, rails=8, generation="Ampere", nic_Bps=25e9)
    assert span.channels("ring") == span.channels("tree") == 8
    assert tuner.bandwidth_Bps("tree", "all_reduce", SIMPLE, fast, span.nodes, span) == pytest.approx(
        8 * tree_GBps * 1e9 * 0.85 / 2, rel=REL)
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL128, fast, span.nodes, span) == pytest.approx(
        min(8 * tree_GBps * 120 / 128, 8 * tree_ll128_GBps) * 1e9 * 0.85 / 2, rel=REL)
    assert tuner.bandwidth_Bps("ring", "all_reduce", LL128, fast, span.nodes, span) == pytest.approx(
        8 * ring_ll128_GBps * 1e9 * ranks / (2 * (ranks - 1)), rel=REL)
    # Hopper's rows, which these nodes took when the fabric had no Ampere: 41.4 / 36.0, 36.7 / 29.0, 36.7 a channel
    hopper = Span(nodes=nodes, ranks=ranks, rails=8, generation="Hopper", nic_Bps=25e9)
    assert tuner.bandwidth_Bps("ring", "all_reduce", LL128, fast, hopper.nodes, hopper) == pytest.approx(
        8 * 36.7e9 * ranks / (2 * (ranks - 1)), rel=REL)


def test_over_two_a100_nodes_on_their_200g_rails_ampere_s_ll128_ceiling_binds_the_ring():
    # The catalog's A100 beyond its 8-GPU domain: nodes on rails of its 200G NICs (25 GB/s, 0.94 of it reached).
    # The rings' 8 channels put a bus bandwidth of 8 x 23.5 = 188 GB/s on the NICs; under LL128 x0.92 = 173,
    # over Ampere's 8 x 20.0 = 160 GB/s (Hopper's 8 x 36.7 = 293.6 would not bind): the message moves at
    # 160 x 16/30. Latencies as tuning.cc rates them (no row of them is by generation): LL 6.6 + 28 x
    # max(0.6, net overhead 1.0) + 2 x 2.7 = 40.0 us; Simple (8.4 + 28 x max(3.4, 3 x 1.0) + 2 x 14.0) x 1.4,
    # the ring's plateau from compute capability 8.0.
    chip = load_chip("a100")
    topology = build_topology(chip_fabric(chip, 16)[0], chip.scaleup_bw_Bps, 16, chip.generation)
    assert (topology.generation, topology.nic_bw_Bps, topology.node.nvls) == ("Ampere", 25e9, False)
    ring = Collectives(topology).costs("all_reduce", [list(range(16))], "ring")
    assert 1 / ring["Simple"].beta_s_per_byte == pytest.approx(8 * 25e9 * 0.94 * 16 / 30, rel=REL)
    assert 1 / ring["LL128"].beta_s_per_byte == pytest.approx(8 * 20.0e9 * 16 / 30, rel=REL)
    assert ring["LL"].alpha_s == pytest.approx(40.0e-6, rel=1e-9)
    assert ring["Simple"].alpha_s == pytest.approx((8.4 + 28 * 3.4 + 2 * 14.0) * 1.4e-6, rel=1e-9)


@pytest.mark.parametrize("chip, ll_max_GBps", [
    ("a100", 87.7), ("h100", 141.0), ("h200", 141.0), ("b200", 282.0), ("gb200", 282.0),  # Ampere, Hopper, Blackwell
])
def test_inside_one_node_ll_takes_the_ceiling_of_its_gpu_generation(chip, ll_max_GBps):
    # tuning.cc llMaxBws[compCapIndex][0] ("for single node, we look at GPU type"): Ampere-N1 87.7, Hopper-N1
    # 141.0, Blackwell-N1 2 x 141.0 GB/s of bus bandwidth, under LL's half of what 8 GPUs' links carry; the
    # ring's x nRanks / nsteps (8/14 for an all-reduce, 8/7 for an all-gather), the tree's x 1/2.
    spec = load_chip(chip)
    topology = build_topology(chip_fabric(spec, 8)[0], spec.scaleup_bw_Bps, 8, spec.generation)
    assert LL_MAX_BUS_BW_ONE_NODE_BPS[topology.generation] == ll_max_GBps * 1e9
    c = Collectives(topology, nvls=False)
    ring = c.costs("all_reduce", [list(range(8))], "ring")
    assert 0.5 / ring["Simple"].beta_s_per_byte > ll_max_GBps * 1e9 * 8 / 14  # the ceiling binds
    assert 1 / ring["LL"].beta_s_per_byte == pytest.approx(ll_max_GBps * 1e9 * 8 / 14, rel=REL)
    gather = c.costs("all_gather", [list(range(8))], "ring")
    assert 1 / gather["LL"].beta_s_per_byte == pytest.approx(ll_max_GBps * 1e9 * 8 / 7, rel=REL)
    span = Span(nodes=1, ranks=8, rails=0, generation=topology.generation, nic_Bps=0.0)
    assert Tuner().bandwidth_Bps("tree", "all_reduce", LL, 1e13, 1, span) == pytest.approx(
        ll_max_GBps * 1e9 / 2, rel=REL)
    # inside a node nothing else of the tuner's binds: no per-channel ceiling, no x.85, no plateau
    assert Tuner().bandwidth_Bps("tree", "all_reduce", SIMPLE, 1e13, 1, span) == pytest.approx(1e13 * 0.92,
                                                                                                   rel=REL)
    assert Tuner().latency_factor("ring", "all_reduce", SIMPLE, span) == 1.0


def test_inside_a_node_of_chips_nccl_has_no_row_for_ll_takes_half_the_links():
    spec = load_chip("tpu-v5p")
    topology = build_topology(chip_fabric(spec, 8)[0], spec.scaleup_bw_Bps, 8, spec.generation)
    ring = Collectives(topology).costs("all_reduce", [list(range(8))], "ring")
    assert ring["LL"].beta_s_per_byte == pytest.approx(ring["Simple"].beta_s_per_byte / 0.5, rel=REL)


def test_amd_cpus_take_their_ll_ceilings_as_assumptions():
    # llMaxBws AMD-N2: 22.5 GB/s of bus bandwidth; over 2 x 8 the rings under LL carry 16/30 of it.
    with Assumptions({"ll_max_bus_bw_two_nodes_Bps": 22.5e9}).active():
        amd = Collectives(nodes_of_8(2))
    ring = amd.costs("all_reduce", [list(range(16))], "ring")
    assert 1 / ring["LL"].beta_s_per_byte == pytest.approx(22.5e9 * 16 / 30, rel=REL)
    plain = Collectives(nodes_of_8(2)).costs("all_reduce", [list(range(16))], "ring")
    assert 1 / plain["LL"].beta_s_per_byte == pytest.approx(39.0e9 * 16 / 30, rel=REL)


def test_blackwell_nodes_take_blackwell_s_ceilings_and_nvls_tree_s_correction():
    # NVLSTree over 2 x 8 Blackwell (900 GB/s links, 800G NICs): perChMaxNVLSTreeBws Blackwell-N2, 96 GB/s a
    # channel, 8 channels x 16/30 = 409.6 GB/s, under the in-switch stage (478 GB/s) and the NICs (752); on
    # Blackwell with x86 CPUs ncclTopoGetAlgoTime takes the tree's correction for NVLSTree too (Simple: 0.5
    # at 1 MiB). Hopper's ceiling on the same links: 57.7 GB/s a channel, and no correction.
    c = Collectives(nodes_of_8(2, "Blackwell", 900e9, 100e9))
    (cost,) = c.costs("all_reduce", [list(range(16))], "nvls_tree").values()
    assert 1 / cost.beta_s_per_byte == pytest.approx(8 * 96.0e9 * 16 / 30, rel=REL)
    assert cost.time_s(2**20) == pytest.approx(cost.alpha_s + 2**20 * cost.beta_s_per_byte / 0.5, rel=REL)
    hopper = Collectives(nodes_of_8(2, "Hopper", 900e9, 100e9))
    (cost,) = hopper.costs("all_reduce", [list(range(16))], "nvls_tree").values()
    assert 1 / cost.beta_s_per_byte == pytest.approx(8 * 57.7e9 * 16 / 30, rel=REL)
    assert cost.time_s(2**20) == pytest.approx(cost.alpha_s + 2**20 * cost.beta_s_per_byte, rel=REL)


def test_groups_that_are_not_nccl_s_or_have_no_nodes_take_no_ceilings():
    # The hierarchical path (no algorithm of NCCL's): the Protocol table's shares of its links alone; a fat tree
    # (no nodes): the same; nodes of full meshes built with no chip (no generation, so no row of NCCL's): the same.
    c = Collectives(nodes_of_8(2))
    group = [list(range(16))]
    hierarchical = c.costs("all_reduce", group, "hierarchical")
    assert hierarchical["LL"].beta_s_per_byte == pytest.approx(hierarchical["Simple"].beta_s_per_byte / 0.5, rel=REL)
    assert c._span(np.arange(8)) is None  # one node
    assert c._span(np.arange(16)) == Span(2, 16, 8, "Hopper", 50e9)
    assert Collectives(FatTree(4, 50e9, 1e-6, levels=2))._span(np.arange(4)) is None
    mesh_nodes = Collectives(Hierarchy(2, FullMesh(8, 64e9, 1e-6), Switch(16, 50e9, 1.35e-6)))
    assert mesh_nodes._span(np.arange(16)) is None
