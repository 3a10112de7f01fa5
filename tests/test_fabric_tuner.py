"""NCCL's tuner's factors and ceilings (fabric/tuner.py) against src/graph/tuning.cc (NCCL 5067397), and how a
group across nodes reaches them: channels, generation, assumptions."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpath.config.assumptions import Assumptions
from tokenpath.fabric.collectives import Collectives
from tokenpath.fabric.fattree import FatTree
from tokenpath.fabric.hierarchy import Hierarchy
from tokenpath.fabric.single_hop import FullMesh, Switch
from tokenpath.fabric.tuner import (
    LL_MAX_BUS_BW_MORE_NODES_BPS,
    LL_MAX_BUS_BW_TWO_NODES_BPS,
    PER_CHANNEL_MAX_BUS_BW_BPS,
    PROTOCOLS,
    RING_SIMPLE_LATENCY_PLATEAU,
    TREE_ALL_REDUCE_EFFICIENCY,
    TREE_CORRECTION,
    TREE_SAME_GPU_NIC_EFFICIENCY,
    Span,
    Tuner,
    correction,
)

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


@pytest.mark.parametrize("rails, ring_channels, nvls_channels", [(8, 8, 8), (5, 5, 5), (4, 8, 4), (1, 2, 1)])
def test_channels_are_one_per_rail_doubled_where_few(rails, ring_channels, nvls_channels):
    # search.cc ncclTopoDupChannels: 4 or fewer channels of 25-50 GB/s double; NVLS graphs never.
    span = Span(nodes=2, ranks=2 * rails, rails=rails, generation="Hopper")
    assert (span.channels("ring"), span.channels("tree"), span.channels("nvls_tree")) == \
        (ring_channels, ring_channels, nvls_channels)


def test_inside_a_node_the_tree_takes_its_efficiency_and_nothing_else():
    tuner = Tuner()
    assert tuner.bandwidth_Bps("tree", "all_reduce", SIMPLE, 100e9, False, None) == pytest.approx(92e9, rel=REL)
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL128, 100e9, False, None) == pytest.approx(92e9 * 7 / 9,
                                                                                                 rel=REL)
    assert tuner.bandwidth_Bps("ring", "all_reduce", LL, 100e9, False, None) == pytest.approx(50e9, rel=REL)
    assert tuner.bandwidth_Bps("nvls_tree", "all_reduce", SIMPLE, 100e9, True, None) == 100e9


def test_across_nodes_the_ceilings_bind_in_the_tuner_s_order():
    tuner = Tuner()
    span = Span(nodes=4, ranks=32, rails=8, generation="Hopper")
    fast = 1e12  # links faster than every ceiling
    # Tree: min(x .92, 8 x 36.0 GB/s), then LL128's min(x 120/128, 8 x 29.0), x .85, as bus bandwidth; x 1/2.
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL128, fast, True, span) == pytest.approx(
        8 * 29.0e9 * 0.85 / 2, rel=REL)
    assert tuner.bandwidth_Bps("tree", "all_reduce", SIMPLE, fast, True, span) == pytest.approx(
        8 * 36.0e9 * 0.85 / 2, rel=REL)
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL, fast, True, span) == pytest.approx(20.4e9 * 0.85 / 2, rel=REL)
    # The ring: LL's ceiling and LL128's per channel, x nRanks / nsteps of the op (all-gather: 32 / 31).
    assert tuner.bandwidth_Bps("ring", "all_reduce", LL, fast, True, span) == pytest.approx(20.4e9 * 32 / 62, rel=REL)
    assert tuner.bandwidth_Bps("ring", "all_gather", LL128, fast, True, span) == pytest.approx(
        8 * 36.7e9 * 32 / 31, rel=REL)
    assert tuner.bandwidth_Bps("ring", "all_gather", SIMPLE, fast, True, span) == fast
    assert tuner.bandwidth_Bps("nvls_tree", "all_reduce", SIMPLE, fast, True, span) == pytest.approx(
        8 * 45.5e9 * 32 / 62, rel=REL)
    # Slow links: the physical rate binds, the protocol's share and the tree's factors still apply.
    assert tuner.bandwidth_Bps("tree", "all_reduce", LL128, 100e9, True, span) == pytest.approx(
        100e9 * 0.92 * 120 / 128 * 0.85, rel=REL)


def test_the_latency_plateau_is_a_simple_ring_all_reduce_s_across_nodes():
    tuner = Tuner()
    span = Span(nodes=2, ranks=16, rails=8, generation="Hopper")
    assert tuner.latency_factor("ring", "all_reduce", SIMPLE, span) == 1.4
    assert tuner.latency_factor("ring", "all_gather", SIMPLE, span) == 1.0
    assert tuner.latency_factor("ring", "all_reduce", LL128, span) == 1.0
    assert tuner.latency_factor("tree", "all_reduce", SIMPLE, span) == 1.0
    assert tuner.latency_factor("ring", "all_reduce", SIMPLE, None) == 1.0


def nodes_of_8(nodes: int, generation: str = "Hopper", link_bw: float = 450e9, nic_bw: float = 50e9) -> Hierarchy:
    return Hierarchy(nodes, Switch(8, link_bw, 0.3e-6, generation=generation), Switch(8 * nodes, nic_bw, 1.35e-6))


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
    # (no nodes): the same; nodes of full meshes (RCCL's, whose tuner has its own tables): the same.
    c = Collectives(nodes_of_8(2))
    group = [list(range(16))]
    hierarchical = c.costs("all_reduce", group, "hierarchical")
    assert hierarchical["LL"].beta_s_per_byte == pytest.approx(hierarchical["Simple"].beta_s_per_byte / 0.5, rel=REL)
    assert c._span(np.arange(8)) is None  # one node
    assert c._span(np.arange(16)) == Span(2, 16, 8, "Hopper")
    assert Collectives(FatTree(4, 50e9, 1e-6, levels=2))._span(np.arange(4)) is None
    mesh_nodes = Collectives(Hierarchy(2, FullMesh(8, 64e9, 1e-6), Switch(16, 50e9, 1.35e-6)))
    assert mesh_nodes._span(np.arange(16)) is None
