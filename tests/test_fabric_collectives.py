"""Collectives as rounds of flows on real topologies: alpha-beta costs checked against hand arithmetic.

Every expected value below is worked out by hand in the comments: alpha = BASE_LATENCY_S plus, per
latency step, the slowest route of the round; beta = per round repetition, the busiest link's bytes per
byte of message over that link's achievable bandwidth (link_bw x efficiency).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collective_costs import wire
from tokenpath.config.errors import UserError
from tokenpath.fabric.collectives import (
    BASE_LATENCY_S,
    LOW_LATENCY_ALL_TO_ALL_S,
    NVLS_LATENCY_S,
    NVLS_LINK_EFFICIENCY,
    SCALEOUT_BW_EFFICIENCY,
    SCALEUP_BW_EFFICIENCY,
    AffineCost,
    Collectives,
    _mesh_ring_links,
)
from tokenpath.fabric.fattree import FatTree
from tokenpath.fabric.single_hop import FullMesh, Switch
from tokenpath.fabric.topology import Traffic
from tokenpath.fabric.torus import Mesh, Torus
from tokenpath.fabric.tuner import PROTOCOLS, TREE_ALL_REDUCE_EFFICIENCY

BW = 450e9          # NVLink per direction
LAT = 0.3e-6        # per link; a chip-to-chip hop through a switch is 2 links = 0.6 us
SU = SCALEUP_BW_EFFICIENCY     # 370/450
SO = SCALEOUT_BW_EFFICIENCY    # 47/50
TORUS_BW = 100e9
TORUS_LAT = 1e-6
REL = 1e-12
TREE_BASE_EXTRA_S = 0.2e-6  # tuning.cc baseLatencies: the tree's LL 6.8 us against the ring's 6.6


def switch(n: int = 8, nvls: bool = True, bw: float = BW) -> Collectives:
    return Collectives(Switch(n, bw, LAT, nvls=nvls))


def whole(n: int) -> list[list[int]]:
    return [list(range(n))]


def same(cost: AffineCost, alpha_s: float, beta_s_per_byte: float) -> None:
    assert cost.alpha_s == pytest.approx(alpha_s, rel=REL, abs=0)
    assert cost.beta_s_per_byte == pytest.approx(beta_s_per_byte, rel=REL, abs=0)


def test_constants_are_the_cited_measurements():
    assert BASE_LATENCY_S == 6.6e-6
    assert NVLS_LATENCY_S == 25.0e-6
    assert SU * 450e9 == pytest.approx(370e9, rel=REL, abs=0)
    assert NVLS_LINK_EFFICIENCY * 450e9 / (1 + 1 / 8) * (2 * 7 / 8) == pytest.approx(480e9, rel=REL, abs=0)
    assert SO * 50e9 == pytest.approx(47e9, rel=REL, abs=0)


# -- ring -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_ring_all_reduce_on_a_switch_hand_computed(n):
    c = switch(n)
    # 2(n-1) steps, each a chip-to-chip hop up and down the switch: 2 links x 0.3 us.
    alpha = BASE_LATENCY_S + 2 * (n - 1) * (2 * LAT)
    # Each step every chip sends 1/n of the message on its own up link: 2(n-1) x (1/n) / (bw x eff).
    beta = 2 * (n - 1) / n / (BW * SU)
    same(wire(c, "all_reduce", whole(n), "ring"), alpha, beta)
    if n == 8:
        assert alpha == pytest.approx(15e-6, rel=REL, abs=0)            # 6.6 + 14 x 0.6 us
        assert 1 / beta == pytest.approx(370e9 * 8 / 14, rel=REL, abs=0)  # algbw = busbw / (2 x 7/8)


def test_protocols_of_the_ring_on_a_switch_are_nccls_tuner_constants():
    # tuning.cc: base latency Ring {LL 6.6, LL128 14.0, Simple 8.4} us, NVLink steps {0.6, 1.9, 3.4} us, and
    # busBw x {0.5, 0.92, 1}: on 8 ranks 15, 41.2 and 56 us. LL's half of the links' 370 GB/s of bus
    # bandwidth, 185, is over its ceiling in one node of Hopper GPUs (the switch's generation with no chip):
    # llMaxBws Hopper-N1, 141 GB/s.
    costs = switch(8).costs("all_reduce", whole(8), "ring")
    assert [p.name for p in PROTOCOLS] == list(costs) == ["LL", "LL128", "Simple"]
    simple_beta = 14 / 8 / (BW * SU)
    assert simple_beta / 0.5 < 14 / 8 / 141.0e9
    same(costs["LL"], 6.6e-6 + 14 * 0.6e-6, 14 / 8 / 141.0e9)
    same(costs["LL128"], 14.0e-6 + 14 * 1.9e-6, simple_beta / 0.92)
    same(costs["Simple"], 8.4e-6 + 14 * 3.4e-6, simple_beta)


def test_protocol_that_runs_is_the_fastest_at_each_size():
    c = switch(8, nvls=False)
    # LL up to where LL128's 26 us more latency buys back its bandwidth: 15 + x/80.6 = 41.2 + x/195 GB/s (LL
    # at its ceiling, 141 GB/s of bus bandwidth) gives about 3.6 MB; LL128 then until Simple's lower bandwidth
    # cost pays its latency back.
    assert c.protocol("all_reduce", 1e6, whole(8)) == "LL"
    assert c.protocol("all_reduce", 16e6, whole(8)) == "LL128"
    assert c.protocol("all_reduce", 4e9, whole(8)) == "Simple"
    costs = c.costs("all_reduce", whole(8), "ring")
    for size in (1e6, 16e6, 4e9):
        assert c.time_s("all_reduce", size, whole(8)) == costs[c.protocol("all_reduce", size, whole(8))].time_s(size)


def test_protocols_across_a_network_take_nccls_network_step_latencies():
    # Two GPUs on different leaves of a fat tree: a route of 4 links of 2.7/4 us, NCCL's NET LL step of the
    # ring; LL128 and Simple take tuning.cc's NET steps, 4.0 and 14.0 us, and the tree its own.
    c = Collectives(FatTree(4, 50e9, 2.7e-6 / 4, levels=2))
    costs = c.costs("all_reduce", [[0, 2]], "ring")
    assert costs["LL"].alpha_s == pytest.approx(6.6e-6 + 2 * 2.7e-6, rel=1e-9)
    assert costs["LL128"].alpha_s == pytest.approx(14.0e-6 + 2 * 4.0e-6, rel=1e-9)
    assert costs["Simple"].alpha_s == pytest.approx(8.4e-6 + 2 * 14.0e-6, rel=1e-9)
    tree = c.costs("all_reduce", [[0, 2]], "tree")
    # the tree's own: baseLatencies Tree {6.8, 14.0, 8.4} us and NET steps {5.0, 8.5, 14.0} us, up and down
    assert [tree[p].alpha_s for p in ("LL", "LL128", "Simple")] == pytest.approx(
        [6.8e-6 + 2 * 5.0e-6, 14.0e-6 + 2 * 8.5e-6, 8.4e-6 + 2 * 14.0e-6], rel=1e-9)
    assert tree["LL128"].beta_s_per_byte == pytest.approx(tree["Simple"].beta_s_per_byte * 128 / 120, rel=1e-9)
    inside = switch(8).costs("all_reduce", whole(8), "tree")
    assert inside["LL128"].beta_s_per_byte == pytest.approx(inside["Simple"].beta_s_per_byte * 9 / 7, rel=1e-9)
    assert inside["LL"].beta_s_per_byte == pytest.approx(inside["Simple"].beta_s_per_byte * 3.8, rel=1e-9)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("n", [2, 4, 8, 7])
def test_ring_all_gather_and_reduce_scatter_take_half_the_steps(op, n):
    c = switch(n)
    # n-1 steps of 1/n each.
    same(wire(c, op, whole(n), "ring"), BASE_LATENCY_S + (n - 1) * 2 * LAT, (n - 1) / n / (BW * SU))
    ar = wire(c, "all_reduce", whole(n), "ring")
    assert ar.beta_s_per_byte == pytest.approx(2 * wire(c, op, whole(n), "ring").beta_s_per_byte, rel=REL, abs=0)


def test_ring_on_a_torus_ring_has_the_switch_beta_and_one_link_per_step():
    c = Collectives(Torus((8,), TORUS_BW, TORUS_LAT))
    # Ranks in order: every neighbour is one hop in the plus direction, each plus link carries 1/8.
    cost = wire(c, "all_reduce", whole(8), "ring")
    same(cost, BASE_LATENCY_S + 14 * TORUS_LAT, 14 * (1 / 8) / (TORUS_BW * SU))
    # The same per-link bandwidth and efficiency behind a switch: the same beta.
    sw = wire(Collectives(Switch(8, TORUS_BW, LAT)), "all_reduce", whole(8), "ring")
    assert cost.beta_s_per_byte == pytest.approx(sw.beta_s_per_byte, rel=REL, abs=0)


def test_ring_on_a_mesh_line_the_closing_flow_takes_the_minus_links():
    mesh = Mesh((8,), TORUS_BW, TORUS_LAT)
    # One round: i -> i+1 (i = 0..6) each on plus link i; the closing 7 -> 0 crosses all 7 minus links.
    # Link order: plus links of cables 0..6 are 0..6, minus links 7..13.
    src = np.arange(8)
    loads = mesh.link_loads(Traffic.from_flows(mesh, src, (src + 1) % 8, 1 / 8))
    np.testing.assert_allclose(loads, np.full(14, 1 / 8), rtol=REL)
    assert mesh.route(7, 0) == {7 + c: 1.0 for c in range(7)}
    # Busiest link 1/8 (plus and minus are separate directions): beta equals the switch's; but the
    # closing flow is 7 hops long and every one of the 14 steps waits for it.
    c = Collectives(mesh)
    same(wire(c, "all_reduce", whole(8), "ring"), BASE_LATENCY_S + 14 * 7 * TORUS_LAT, 14 * (1 / 8) / (TORUS_BW * SU))


def test_ring_order_on_a_mesh_line_changes_latency_and_congestion():
    c = Collectives(Mesh((8,), TORUS_BW, TORUS_LAT))
    # Folded ring 0,2,4,6,7,5,3,1: out along even chips on plus links (2 hops each, 6->7 one hop), back
    # along odd chips on minus links; every link carries exactly one flow of 1/8; longest route 2 hops.
    folded = wire(c, "all_reduce", [[0, 2, 4, 6, 7, 5, 3, 1]], "ring")
    same(folded, BASE_LATENCY_S + 14 * 2 * TORUS_LAT, 14 * (1 / 8) / (TORUS_BW * SU))
    # Interleaved ring 0,4,1,5,2,6,3,7: 0->4, 1->5, 2->6, 3->7 all cross plus cable 3 (4 x 1/8 = 1/2),
    # and 4->1, 5->2, 6->3, 7->0 all cross minus cable 3 (1/2); longest route 7 -> 0 = 7 hops.
    bad = wire(c, "all_reduce", [[0, 4, 1, 5, 2, 6, 3, 7]], "ring")
    same(bad, BASE_LATENCY_S + 14 * 7 * TORUS_LAT, 14 * (1 / 2) / (TORUS_BW * SU))


# -- congestion between groups -----------------------------------------------------------------------

def test_two_rings_sharing_mesh_links_take_twice_as_long_and_disjoint_rings_do_not():
    c = Collectives(Mesh((8,), TORUS_BW, TORUS_LAT))
    evens, odds = [0, 2, 4, 6], [1, 3, 5, 7]
    # evens alone: 0->2 (plus cables 0,1), 2->4 (2,3), 4->6 (4,5), 6->0 (minus cables 0..5), each 1/4;
    # 6 steps, longest route 6 hops.
    alone = wire(c, "all_reduce", [evens], "ring")
    same(alone, BASE_LATENCY_S + 6 * 6 * TORUS_LAT, 6 * (1 / 4) / (TORUS_BW * SU))
    # With odds: plus cable 1 carries 0->2 and 1->3 (1/2); minus cable 1 carries 6->0 and 7->1.
    both = wire(c, "all_reduce", [evens, odds], "ring")
    same(both, BASE_LATENCY_S + 6 * 6 * TORUS_LAT, 6 * (1 / 2) / (TORUS_BW * SU))
    # Halves 0..3 and 4..7 use cables 0..2 and 4..6: nothing shared (cable 3 idle), same as one alone.
    left = wire(c, "all_reduce", [[0, 1, 2, 3]], "ring")
    same(left, BASE_LATENCY_S + 6 * 3 * TORUS_LAT, 6 * (1 / 4) / (TORUS_BW * SU))
    assert wire(c, "all_reduce", [[0, 1, 2, 3], [4, 5, 6, 7]], "ring") == left
    size = 1e9
    assert c.time_s("all_reduce", size, [evens, odds], "ring") > c.time_s("all_reduce", size, [evens], "ring")


def test_tp_groups_sharing_an_oversubscribed_leaf_uplink_are_slower():
    bw = 50e9
    # k=4 leaf-spine: 4 leaves of 2 hosts, 2 spines; 2:1 oversubscription: uplinks of 25 GB/s.
    c = Collectives(FatTree(4, bw, 1e-6, levels=2, oversubscription=(2.0,)))
    # Ring of [0, 2] (leaves 0 and 1): 2 steps of 1/2. Host link 1/2 at bw; leaf 0 sends 1/2 split over
    # its 2 uplinks: 1/4 each at bw/2, i.e. also 1/2 per bw. beta = 2 x (1/2) / (bw x SO).
    # Latency: host-leaf-spine-leaf-host = 4 links of 1 us, paid on each of the 2 steps.
    one = wire(c, "all_reduce", [[0, 2]], "ring")
    same(one, BASE_LATENCY_S + 2 * 4e-6, 2 * (1 / 2) / (bw * SO))
    # Add [1, 3]: leaf 0 now sends 1/2 + 1/2 = 1 over 2 uplinks: 1/2 each at bw/2 = 1 per bw.
    shared = wire(c, "all_reduce", [[0, 2], [1, 3]], "ring")
    same(shared, BASE_LATENCY_S + 2 * 4e-6, 2 * 1 / (bw * SO))
    # [4, 6] sits on leaves 2 and 3: no link in common with [0, 2].
    assert wire(c, "all_reduce", [[0, 2], [4, 6]], "ring") == one


# -- halving-doubling --------------------------------------------------------------------------------

def test_halving_doubling_on_8_ranks_of_a_switch():
    c = switch(8)
    # Reduce-scatter: partners at distance 4, 2, 1 exchanging 1/2, 1/4, 1/8; all-gather mirrors it.
    # 3 + 3 rounds, one hop (2 links) each: alpha = 6.6 + 6 x 0.6 us; beta = 2 x 7/8 / (bw x eff).
    ar = wire(c, "all_reduce", whole(8), "halving_doubling")
    same(ar, BASE_LATENCY_S + 6 * 2 * LAT, 2 * (1 / 2 + 1 / 4 + 1 / 8) / (BW * SU))
    assert ar.alpha_s == pytest.approx(10.2e-6, rel=REL, abs=0)
    for op in ("all_gather", "reduce_scatter"):
        same(wire(c, op, whole(8), "halving_doubling"), BASE_LATENCY_S + 3 * 2 * LAT, (7 / 8) / (BW * SU))


def test_halving_doubling_is_offered_for_powers_of_two_only():
    c = switch(16)
    for n in (2, 4, 8, 16):
        assert "halving_doubling" in c.available("all_reduce", n)
        assert "halving_doubling" in c.available("reduce_scatter", n)
    for n in (3, 5, 6, 7, 12):
        assert "halving_doubling" not in c.available("all_reduce", n)
    assert c.available("all_reduce", 8) == ["ring", "tree", "nvls", "halving_doubling"]
    assert c.available("all_gather", 6) == ["ring"]


def test_halving_doubling_on_a_mesh_line_piles_up_on_the_middle_cable():
    c = Collectives(Mesh((8,), TORUS_BW, TORUS_LAT))
    # Distance 4 (1/2 each): 0->4, 1->5, 2->6, 3->7 all cross plus cable 3: 2.0 per byte; 4 hops.
    # Distance 2 (1/4): 0->2 and 1->3 cross plus cable 1: 1/2; 2 hops. Distance 1 (1/8): 1/8; 1 hop.
    rs = wire(c, "reduce_scatter", whole(8), "halving_doubling")
    same(rs, BASE_LATENCY_S + (4 + 2 + 1) * TORUS_LAT, (2 + 1 / 2 + 1 / 8) / (TORUS_BW * SU))
    ar = wire(c, "all_reduce", whole(8), "halving_doubling")
    same(ar, BASE_LATENCY_S + 2 * 7 * TORUS_LAT, 2 * (2 + 1 / 2 + 1 / 8) / (TORUS_BW * SU))


# -- rings on a full mesh ----------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "rings"), [(2, 1), (3, 2), (4, 2), (5, 4), (6, 4), (8, 7)])
def test_rings_on_a_full_mesh_share_its_links(n, rings):
    # RCCL's channels go round in different orders: n - 1 rings sharing no link, 2 and 4 for 4 and 6 ranks
    # (Tillson 1980), each its share of the message; the latency is one ring's.
    c = Collectives(FullMesh(n, BW, LAT))
    same(wire(c, "all_gather", whole(n), "ring"), BASE_LATENCY_S + (n - 1) * LAT, (n - 1) / n / rings / (BW * SU))
    same(wire(c, "all_reduce", whole(n), "ring"), BASE_LATENCY_S + 2 * (n - 1) * LAT,
         2 * (n - 1) / n / rings / (BW * SU))


def test_mesh_rings_share_no_link():
    for n in range(2, 10):
        src, dst = _mesh_ring_links(n)
        assert len(set(zip(src.tolist(), dst.tolist()))) == len(src) and (src != dst).all()
        for ranks in (src, dst):  # each rank sends and receives once per ring
            assert (np.bincount(ranks, minlength=n) == len(src) // n).all()


def test_a_full_mesh_outruns_the_ring_its_links_include():
    # 7 links a rank against a ring's 2 (one each way): at a large size, 3.5 times as fast
    size = 2**30
    mesh, ring = Collectives(FullMesh(8, 64e9, LAT)), Collectives(Torus((8,), 64e9, LAT))
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        assert ring.time_s(op, size, whole(8)) / mesh.time_s(op, size, whole(8)) == pytest.approx(3.5, rel=0.01)


# -- double binary tree ------------------------------------------------------------------------------

def test_double_binary_tree_on_a_switch_of_8():
    sw = Switch(8, BW, LAT)
    # Tree 1 (child -> parent): 1,2->0; 3,4->1; 5,6->2; 7->3. Tree 2 mirrors i -> 7-i.
    tree1 = [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 2), (7, 3)]
    tree2 = [(7 - a, 7 - b) for a, b in tree1]
    edges = np.array(tree1 + tree2)
    # Each edge carries half the message both ways.
    src = np.concatenate([edges[:, 0], edges[:, 1]])
    dst = np.concatenate([edges[:, 1], edges[:, 0]])
    up = sw.link_loads(Traffic.from_flows(sw, src, dst, 0.5))[:8]
    # Degrees (tree 1 + tree 2): 0: 2+1, 1: 3+1, 2: 3+1, 3: 2+1, and mirrored; x 0.5 per edge.
    np.testing.assert_allclose(up, 0.5 * np.array([3, 4, 4, 3, 3, 4, 4, 3]), rtol=REL)
    # Busiest up link: 3 edges interior in one tree + 1 edge leaf in the other = 2 per byte, at 0.92 of the
    # link's rate (tuning.cc: a tree all-reduce's bus bandwidth x .92, inside a node too).
    # Latency: inside one switch NCCL chains the ranks, 2 x (8 - 1) = 14 steps of one hop (2 links).
    c = Collectives(sw)
    same(wire(c, "all_reduce", whole(8), "tree"), BASE_LATENCY_S + TREE_BASE_EXTRA_S + 14 * 2 * LAT,
         2 / (BW * SU * TREE_ALL_REDUCE_EFFICIENCY))


@pytest.mark.parametrize("n, steps", [(2, 2), (3, 4), (5, 8), (16, 30)])
def test_tree_latency_inside_one_switch_is_a_chain_of_its_ranks(n, steps):
    c = switch(n)
    assert wire(c, "all_reduce", whole(n), "tree").alpha_s == pytest.approx(
        BASE_LATENCY_S + TREE_BASE_EXTRA_S + steps * 2 * LAT, rel=REL, abs=0)


def test_tree_latency_across_a_network_is_twice_the_depth():
    # 8 hosts on one 8-port leaf of a leaf-spine: every route is 2 links, the tree 2 x 3 steps deep, each
    # network step under LL 5.0 / 2.7 of the ring's (tuning.cc hwLatencies NET Tree against Ring)
    c = Collectives(FatTree(16, 50e9, LAT, levels=2))
    assert wire(c, "all_reduce", whole(8), "tree").alpha_s == pytest.approx(
        BASE_LATENCY_S + TREE_BASE_EXTRA_S + 6 * 2 * LAT * 5.0 / 2.7, rel=REL, abs=0)


@pytest.mark.parametrize("n, depth", [(3, 1), (5, 2), (6, 2), (7, 2), (8, 3)])
def test_tree_depth_is_that_of_its_binary_tree(n, depth):
    # Rank i's parent is (i - 1) // 2, so n ranks reach floor(log2 n) levels below the root: 3 ranks are a
    # root and two leaves, depth 1; 5 to 7 ranks depth 2 (NCCL's tuner: log2i(nNodes)). One leaf of a
    # leaf-spine: every route 2 links, each network step under LL 5.0 / 2.7 of the ring's.
    c = Collectives(FatTree(16, 50e9, LAT, levels=2))
    assert wire(c, "all_reduce", whole(n), "tree").alpha_s == pytest.approx(
        BASE_LATENCY_S + TREE_BASE_EXTRA_S + 2 * depth * 2 * LAT * 5.0 / 2.7, rel=REL, abs=0)


def test_tree_serves_all_reduce_only():
    c = switch(8)
    assert "tree" not in c.available("all_gather", 8)
    assert wire(c, "all_gather", whole(8), "tree") == wire(c, "all_gather", whole(8), "ring")


# -- NVLS --------------------------------------------------------------------------------------------

def test_nvls_needs_an_nvls_switch():
    assert "nvls" in switch(8, nvls=True).available("all_reduce", 8)
    assert "nvls" not in switch(8, nvls=False).available("all_reduce", 8)
    assert "nvls" not in Collectives(Torus((8,), TORUS_BW, TORUS_LAT)).available("all_reduce", 8)
    with pytest.raises(UserError, match="fabric.algorithm: 'nvls' cannot run all_reduce over 8 ranks on a switch"):
        wire(switch(8, nvls=False), "all_reduce", whole(8), "nvls")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_nvls_cost_and_bus_bandwidth(n):
    c = switch(8)
    # Each rank's buffer goes up and its slice of the sum comes back, then the slices are stored to all:
    # (1 + 1/n) per byte on both host links.
    same(wire(c, "all_reduce", whole(n), "nvls"), NVLS_LATENCY_S, (1 + 1 / n) / (BW * NVLS_LINK_EFFICIENCY))
    if n == 8:
        # algbw -> 450 x 0.686 / 1.125 = 274.29 GB/s; busbw = algbw x 2 x 7/8 = 480 GB/s.
        busbw = c.bus_bandwidth_Bps("all_reduce", 1e12, whole(8), "nvls")
        assert busbw == pytest.approx(480e9, rel=1e-5, abs=0)
        assert busbw < 480e9


def test_nvls_falls_back_to_ring_for_other_ops():
    c = switch(8)
    for op in ("all_gather", "reduce_scatter"):
        assert wire(c, op, whole(8), "nvls") == wire(c, op, whole(8), "ring")


# -- bucket on a torus box ---------------------------------------------------------------------------

def test_bucket_beats_ring_on_a_4x4_torus():
    c = Collectives(Torus((4, 4), TORUS_BW, TORUS_LAT))
    eff = TORUS_BW * SU
    # Ring over 0..15 (row-major): in-row flows one hop on dim 1; row ends (r,3)->(r+1,0) go down dim 0
    # one hop then round the dim-1 wrap cable: 2 hops. No link is shared: busiest 1/16.
    # 30 steps: beta = 30/16 / eff; alpha = 6.6 us + 30 x 2 hops.
    ring = wire(c, "all_reduce", whole(16), "ring")
    same(ring, BASE_LATENCY_S + 30 * 2 * TORUS_LAT, (30 / 16) / eff)
    # Bucket, the two dimensions equal, so two shards run at once: shard 0 reduce-scatters along dim 0
    # while shard 1 does dim 1, each half the message, both ring directions: (1/2)(1/4)/2 = 1/16 on
    # every one-hop link for 3 steps; then the other dimension on a quarter: 1/64 for 3 steps.
    # All-gather mirrors. beta = 2 x 3 x (1/16 + 1/64) / eff = 15/32 / eff; alpha 6.6 us + 12 one-hop steps.
    bucket = wire(c, "all_reduce", whole(16), "bucket")
    same(bucket, BASE_LATENCY_S + 12 * TORUS_LAT, (15 / 32) / eff)
    assert bucket.beta_s_per_byte == pytest.approx(ring.beta_s_per_byte / 4, rel=REL, abs=0)
    # Reduce-scatter alone: half of it.
    same(wire(c, "reduce_scatter", whole(16), "bucket"), BASE_LATENCY_S + 6 * TORUS_LAT, (15 / 64) / eff)
    # Unequal dimensions (a 2 x 4 box of a 4x4 torus): one shard alone, the whole ring first, would move
    # dim 1 (1/4/2 = 1/8 each way, 3 steps), then dim 0 on a quarter (extent 2 of a ring of 4, a line:
    # both ring directions reach the same partner over the same link, 2 x 1/4/2/2 = 1/8, 1 step): 3/8 +
    # 1/8 a link each way. Two shards in phases move less. Phase 1: shard A along dim 1 (3/8 of its half
    # a link, 3 steps) while B goes along dim 0 (a line: 1/2 of its half, 1 step): 1/4, 3 steps. Phase 2:
    # A along dim 0 on a quarter (1/8), B along dim 1 on a half (3/16): 3/32, 3 steps. All-reduce:
    # beta = 2 x (1/4 + 3/32) / eff = 11/16 / eff, alpha 6.6 us + 12 one-hop steps.
    two_by_four = wire(c, "all_reduce", [list(range(8))], "bucket")
    same(two_by_four, BASE_LATENCY_S + 12 * TORUS_LAT, 11 / 16 / eff)
    # The 4 x 2 box (columns 0 and 1) is the same shape turned: the same cost.
    assert wire(c, "all_reduce", [[0, 1, 4, 5, 8, 9, 12, 13]], "bucket") == two_by_four
    assert c.choose("all_reduce", 1e9, whole(16)) == "bucket"


def test_a_box_of_unequal_sides_runs_its_shards_in_phases_with_no_cliff():
    # A 2 x 4 x 4 box of a 4 x 4 x 4 torus has more links a chip than the 4 x 4 plane in it: its all-reduce
    # takes about as long (one shard at a time took twice as long)
    c = Collectives(Torus((4, 4, 4), TORUS_BW, TORUS_LAT))
    plane, box = (c.time_s("all_reduce", 2**30, [list(range(n))]) for n in (16, 32))
    assert plane < box < 1.1 * plane
    assert c.choose("all_reduce", 2**30, [list(range(32))]) == "bucket"


def test_bucket_is_not_offered_for_a_group_that_is_not_a_box():
    c = Collectives(Torus((4, 4), TORUS_BW, TORUS_LAT))
    odd = [[0, 1, 2, 5]]   # (0,0), (0,1), (0,2), (1,1): bounding box 2 x 3 = 6 != 4
    with pytest.raises(UserError, match="fabric.algorithm: 'bucket' cannot run all_reduce over 4 ranks on a torus"):
        wire(c, "all_reduce", odd, "bucket")
    for size in (1.0, 1e6, 1e9):
        assert c.choose("all_reduce", size, odd) != "bucket"
        assert c.time_s("all_reduce", size, odd) == min(
            c.time_s("all_reduce", size, odd, a) for a in ("ring", "tree"))
    # A 2 x 2 box is fine.
    assert wire(c, "all_reduce", [[5, 6, 9, 10]], "bucket").beta_s_per_byte > 0


# -- all-to-all --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_to_all_on_a_switch(n):
    c = switch(8)
    # Each rank sends 1/n to each of n-1 others: its up link carries (n-1)/n; routes are 2 links.
    same(wire(c, "all_to_all", whole(n)), BASE_LATENCY_S + 2 * LAT, ((n - 1) / n) / (BW * SU))


def test_low_latency_all_to_all_adds_the_kernels_fixed_cost_and_nothing_else():
    c = switch(8)
    same(wire(c, "all_to_all", whole(8), "low_latency"),
         BASE_LATENCY_S + 2 * LAT + LOW_LATENCY_ALL_TO_ALL_S, (7 / 8) / (BW * SU))
    # Auto (and any reduction algorithm) runs the plain all-to-all; low-latency kernels are all-to-all only.
    assert wire(c, "all_to_all", whole(8), "ring") == wire(c, "all_to_all", whole(8))
    with pytest.raises(UserError, match="fabric.algorithm: 'low_latency' cannot run all_reduce over 8 ranks"):
        wire(c, "all_reduce", whole(8), "low_latency")


def test_all_to_all_of_64_ranks_on_a_switch_uses_the_diameter_latency():
    c = switch(64)
    # 64 x 64 = 4096 > 1024 flows: latency bounded by diameter (2) x link latency; loads folded.
    same(wire(c, "all_to_all", whole(64)), BASE_LATENCY_S + 2 * LAT, (63 / 64) / (BW * SU))


def test_all_to_all_of_64_ranks_on_an_oversubscribed_fat_tree_hand_computed():
    bw = 50e9
    t = FatTree(8, bw, 1e-6, levels=3, oversubscription=(2.0, 4.0))
    c = Collectives(t)
    # k=8: 4 hosts per edge switch, 16 per pod; ranks 0..63 fill pods 0..3. Per byte of message:
    #   host link: 63/64;
    #   edge uplink: 4 hosts x 60 ranks off the edge x 1/64 = 3.75, over 4 uplinks = 0.9375 at bw/2
    #     -> 1.875 per bw;
    #   core uplink: 16 hosts x 48 ranks off the pod x 1/64 = 12, over 16 uplinks = 0.75 at bw/4
    #     -> 3 per bw (the busiest).
    cost = wire(c, "all_to_all", whole(64))
    same(cost, BASE_LATENCY_S + 6 * 1e-6, 3 / (bw * SO))
    # The folded path agrees with the 4032 explicit flows.
    src, dst = np.nonzero(~np.eye(64, dtype=bool))
    loads = t.link_loads(Traffic.from_flows(t, src, dst, 1 / 64))
    assert float((loads / (t.links.bw_Bps * SO)).max()) == pytest.approx(cost.beta_s_per_byte, rel=1e-9, abs=0)


def test_all_to_all_of_two_groups_on_a_switch_does_not_interfere():
    c = switch(8)
    assert wire(c, "all_to_all", [[0, 1, 2, 3], [4, 5, 6, 7]]) == wire(c, "all_to_all", [[0, 1, 2, 3]])


# -- send/recv ---------------------------------------------------------------------------------------

def test_send_recv_across_a_mesh_line():
    c = Collectives(Mesh((4,), TORUS_BW, TORUS_LAT))
    # 0 -> 3: three plus links, each carrying the whole message.
    same(wire(c, "send_recv", [[0, 3]]), BASE_LATENCY_S + 3 * TORUS_LAT, 1 / (TORUS_BW * SU))
    assert c.available("send_recv", 2) == ["direct"]
    # Any requested algorithm is point-to-point for send_recv.
    assert wire(c, "send_recv", [[0, 3]], "ring") == wire(c, "send_recv", [[0, 3]])


def test_send_recv_chain_on_a_switch():
    c = switch(8)
    # Pipeline 0 -> 1 -> 2: each stage sends its whole buffer on its own up link at once.
    same(wire(c, "send_recv", [[0, 1, 2]]), BASE_LATENCY_S + 2 * LAT, 1 / (BW * SU))


# -- auto, sizes and degenerate groups ---------------------------------------------------------------

_CASES = {
    # halving-doubling runs when asked for; auto picks among what NCCL (or a TPU runtime) runs.
    "switch8": (lambda: switch(8), whole(8), {"all_reduce": ["ring", "tree", "nvls"], "all_gather": ["ring"]}),
    "switch6_no_nvls": (lambda: switch(8, nvls=False), whole(6), {"all_reduce": ["ring", "tree"],
                                                                  "all_gather": ["ring"]}),
    "torus4x4": (lambda: Collectives(Torus((4, 4), TORUS_BW, TORUS_LAT)), whole(16),
                 {"all_reduce": ["ring", "tree", "bucket"], "all_gather": ["ring", "bucket"]}),
    "torus_not_box": (lambda: Collectives(Torus((4, 4), TORUS_BW, TORUS_LAT)), [[0, 1, 2, 5]],
                      {"all_reduce": ["ring", "tree"], "all_gather": ["ring"]}),
    # [0, 2, 4, 6] is no box of the 8-line (it spans 7 chips), so bucket is not a candidate.
    "mesh_two_groups": (lambda: Collectives(Mesh((8,), TORUS_BW, TORUS_LAT)), [[0, 2, 4, 6], [1, 3, 5, 7]],
                        {"all_reduce": ["ring", "tree"], "all_gather": ["ring"]}),
}
_BUILT: dict[str, Collectives] = {}


def _case(name: str) -> tuple[Collectives, list[list[int]], dict[str, list[str]]]:
    make, groups, names = _CASES[name]
    if name not in _BUILT:
        _BUILT[name] = make()
    return _BUILT[name], groups, names


@settings(max_examples=120, deadline=None)
@given(case=st.sampled_from(sorted(_CASES)), op=st.sampled_from(["all_reduce", "all_gather"]),
       size=st.one_of(st.floats(1.0, 1e11), st.integers(1, 2**40).map(float)))
def test_auto_is_the_minimum_over_the_available_algorithms_and_their_protocols(case, op, size):
    c, groups, names = _case(case)
    times = {a: c.time_s(op, size, groups, a) for a in names[op]}
    chosen = c.choose(op, size, groups)
    assert chosen in names[op] and times[chosen] == min(times.values())
    assert c.time_s(op, size, groups) == times[chosen] == c.cost(op, groups, size_bytes=size).time_s(size)
    # Each algorithm runs under its fastest protocol at this size.
    for a in names[op]:
        assert times[a] == min(cost.time_s(size) for cost in c.costs(op, groups, a).values())


def test_auto_cost_is_the_choice_at_one_mebibyte():
    c = switch(8)
    assert c.cost("all_reduce", whole(8)) == c.cost("all_reduce", whole(8), c.choose("all_reduce", 2**20, whole(8)))
    # Where the choice flips: small messages keep the ring (6.6 us + 14 steps of 0.6 us, NCCL's LL
    # ring), as nccl-tests measures 15.6 us at 512 B on 8 H100s; NVLS wins from about 10 MB;
    # the ring beats NVLS on 2 ranks at large sizes.
    assert c.choose("all_reduce", 1024, whole(8)) == "ring"
    assert c.time_s("all_reduce", 1024, whole(8)) == pytest.approx(15.0e-6, rel=0.02)
    assert c.choose("all_reduce", 64e6, whole(8)) == "nvls"
    assert c.choose("all_reduce", 8e9, whole(2)) == "ring"


@pytest.mark.parametrize("algorithm", ["auto", "ring", "tree", "halving_doubling", "nvls"])
def test_no_bytes_or_one_rank_costs_nothing(algorithm):
    c = switch(8)
    assert c.time_s("all_reduce", 0, whole(8), algorithm) == 0.0
    assert c.time_s("all_reduce", -5, whole(8), algorithm) == 0.0
    assert wire(c, "all_reduce", [[3]], algorithm) == AffineCost(0.0, 0.0)
    assert c.time_s("all_reduce", 1e9, [[3]], algorithm) == 0.0
    assert c.time_s("all_to_all", 1e9, [[3]]) == 0.0
    assert c.bus_bandwidth_Bps("all_reduce", 1e9, [[3]], algorithm) == 0.0


def test_affine_cost_is_exact_in_size():
    c = Collectives(Torus((4, 4), TORUS_BW, TORUS_LAT))
    cost = wire(c, "all_reduce", whole(16), "bucket")
    for size in (1.0, 3e5, 7e9):
        assert c.time_s("all_reduce", size, whole(16), "bucket") == pytest.approx(
            cost.alpha_s + size * cost.beta_s_per_byte, rel=REL, abs=0)


def test_explicit_efficiency_replaces_the_default():
    c = Collectives(Switch(8, BW, LAT), bw_efficiency=1.0)
    same(wire(c, "all_reduce", whole(8), "ring"), BASE_LATENCY_S + 14 * 2 * LAT, (14 / 8) / BW)


# -- errors ------------------------------------------------------------------------------------------

def test_unknown_op_is_a_user_error():
    c = switch(8)
    with pytest.raises(UserError, match="collective: unknown 'broadcast'"):
        c.time_s("broadcast", 1e6, whole(8))
    with pytest.raises(UserError, match="collective: unknown 'broadcast'"):
        wire(c, "broadcast", whole(8), "ring")
    with pytest.raises(UserError, match="collective: unknown 'broadcast'"):
        c.available("broadcast", 8)


def test_unknown_algorithm_is_a_user_error():
    with pytest.raises(UserError, match="fabric.algorithm: unknown 'fastest'"):
        Collectives(Switch(8, BW, LAT), "fastest")


def test_unavailable_algorithms_are_user_errors_naming_the_field():
    with pytest.raises(UserError, match=r"fabric.algorithm: 'halving_doubling' cannot run all_reduce over 6 ranks"):
        switch(8).cost("all_reduce", whole(6), "halving_doubling")
    with pytest.raises(UserError, match=r"fabric.algorithm: 'bucket' cannot run"):
        Collectives(Torus((4, 4), TORUS_BW, TORUS_LAT)).cost("all_reduce", [[0, 1, 2, 5]], "bucket")
    with pytest.raises(UserError, match=r"fabric.algorithm: 'bucket' cannot run all_reduce over 8 ranks on a switch"):
        switch(8).cost("all_reduce", whole(8), "bucket")
    with pytest.raises(UserError, match=r"fabric.algorithm: 'hierarchical' cannot run"):
        switch(8).time_s("all_reduce", 1e6, whole(8), "hierarchical")


def test_hosts_outside_the_topology_are_user_errors():
    with pytest.raises(UserError, match=r"placement: host 8 is outside this 8-host switch; use hosts 0..7"):
        switch(8).time_s("all_reduce", 1e6, [[0, 8]])
    with pytest.raises(UserError, match=r"placement: host -1 is outside"):
        switch(8).cost("all_reduce", [[-1, 0]], "ring")
    with pytest.raises(UserError, match=r"placement: host 16 is outside this 16-host torus"):
        Collectives(Torus((4, 4), TORUS_BW, TORUS_LAT)).time_s("all_to_all", 1e6, [[0, 16]])
    # Even a one-rank group is checked.
    with pytest.raises(UserError, match=r"placement: host 9 is outside"):
        switch(8).cost("all_reduce", [[9]], "ring")


def test_traffic_outside_the_topology_is_a_user_error():
    from tokenpath.config.errors import UserError

    t = Switch(4, 1e9, 1e-6)
    with pytest.raises(UserError, match="traffic: host 4 is outside this 4-host switch"):
        Traffic.from_flows(t, [0, 4], [1, 2], 1.0)
    with pytest.raises(UserError, match="traffic: host -1 is outside"):
        Traffic.all_to_all(t, 1.0, hosts=[0, -1])
    with pytest.raises(ValueError, match="listed twice"):
        Traffic.all_to_all(t, 1.0, hosts=[0, 1, 1])
