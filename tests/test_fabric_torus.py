"""Tori and meshes: closed forms against hand counts and brute force, and the vectorized link loads
against the per-pair routes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.config.errors import UserError
from tokenpath.fabric.collectives import BASE_LATENCY_S, SCALEUP_BW_EFFICIENCY, Collectives
from tokenpath.fabric.topology import Traffic
from tokenpath.fabric.torus import Mesh, Torus

BW = 100e9       # bytes/s per direction
LAT = 1e-6       # s per hop

# Small shapes covering rings (even, odd), lines, size-2 dimensions, and 1D/2D/3D.
SMALL = [(8,), (5,), (2,), (4, 4), (3, 2), (6, 4), (5, 3), (2, 2, 2), (3, 4, 2), (4, 3, 3)]


def make(dims, wrap: bool) -> Torus:
    return Torus(dims, BW, LAT) if wrap else Mesh(dims, BW, LAT)


def reference_loads(t: Torus, demand: np.ndarray) -> np.ndarray:
    """Sum over host pairs of demand x the route's fractions."""
    loads = np.zeros(len(t.links))
    for s, d in itertools.product(range(t.hosts), repeat=2):
        if s != d and demand[s, d]:
            for link, share in t.route(s, d).items():
                loads[link] += demand[s, d] * share
    return loads


def plus_minus(t: Torus, loads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 1D topology's loads split into plus (i -> i+1) and minus links, indexed by cable."""
    n = t.cables
    return loads[:n], loads[n:]


# -- closed forms against hand counts -------------------------------------------------------------

# dims, wraparound, cables, diameter, avg hops (distinct pairs), bisection cables
HAND = [
    ((8,), True, 8, 4, 16 / 7, 2),          # ring of 8: distances 1,1,2,2,3,3,4 -> 16/7
    ((8,), False, 7, 7, 3.0, 1),            # line of 8: sum |i-j| = 168 over 56 pairs
    ((5,), True, 5, 2, 1.5, 2),             # ring of 5: distances 1,1,2,2
    ((2,), True, 2, 1, 1.0, 2),             # ring of 2: two cables between the same two chips
    ((2,), False, 1, 1, 1.0, 1),            # line of 2: one cable
    ((4, 4), True, 32, 4, 32 / 15, 8),      # per ring mean 1 incl. identical; 2 * 16/15
    ((4, 4), False, 24, 6, 8 / 3, 4),       # per line (16-1)/12 = 5/4; 5/2 * 16/15
    ((6, 4), True, 48, 5, 60 / 23, 8),      # (6/4 + 4/4) * 24/23; cut the 6: 2 * 24/6
    ((5, 3), True, 30, 3, 2.0, 8),          # (24/20 + 8/12) * 15/14; cut the 5 (2 * 15/5) and split the middle
                                            # 3-ring (2)
    ((3, 2), True, 12, 2, 7 / 5, 6),        # (8/12 + 1/2) * 6/5; cut the 2 (two cables a pair: 6), or the 3
                                            # (4) and the middle slice's ring of 2 (2)
    ((4, 4, 4), True, 192, 6, 64 / 21, 32),  # 3 * 64/63
    ((2, 2, 2), True, 24, 3, 12 / 7, 8),    # the 3-cube with every edge doubled: distances 1,1,1,2,2,2,3
    ((2, 2, 2), False, 12, 3, 12 / 7, 4),   # the 3-cube
    ((8, 4, 2), False, 136, 11, 40 / 9, 8),  # 56+48+32 cables; (63/24 + 15/12 + 3/6) * 64/63
]


@pytest.mark.parametrize("dims, wrap, cables, diameter, avg, bisection", HAND)
def test_closed_forms_match_hand_counts(dims, wrap, cables, diameter, avg, bisection):
    t = make(dims, wrap)
    assert t.hosts == t.routers == math.prod(dims)
    assert t.cables == cables
    assert t.diameter() == diameter
    assert t.avg_hops() == pytest.approx(avg, rel=1e-12)
    assert t.bisection_bw_Bps() == pytest.approx(bisection * BW)


def test_cable_counts_follow_the_general_formulas():
    for dims in [(3,), (7, 3), (4, 5, 6), (9, 9)]:
        n = math.prod(dims)
        assert Torus(dims, BW, LAT).cables == len(dims) * n
        assert Mesh(dims, BW, LAT).cables == round(n * sum((k - 1) / k for k in dims))


def test_a_direct_network_with_row_major_numbering():
    t = Torus((2, 3), BW, LAT)
    assert (t.kind, Mesh((2, 3), BW, LAT).kind, Torus((2, 3), BW, LAT, wraparound=False).kind) == \
        ("torus", "mesh", "mesh")
    assert t.direct and t.switches == 0 and t.routers == t.hosts == 6
    assert np.array_equal(t.host_router, np.arange(6))
    assert t.coords(5) == (1, 2) and t.coords(1) == (0, 1)  # last dimension fastest
    assert t.tier_names == ("dim0", "dim1")
    # dim0 (ring of 2): two cables per column; dim1 (ring of 3): three cables per row, wrap included.
    assert np.array_equal(np.bincount(t.links.tier), [2 * 6, 2 * 6])
    assert np.array_equal(np.bincount(Mesh((2, 3), BW, LAT).links.tier), [2 * 3, 2 * 4])
    assert np.array_equal(t.link_loads(Traffic.all_to_all(t, 0.0)), np.zeros(len(t.links)))


def test_route_splits_ties_between_both_ways_round():
    t = Torus((4, 4), BW, LAT)
    route = t.route(0, 10)  # (0, 0) -> (2, 2): half way round in both dimensions
    hops = {(int(t.links.src[i]), int(t.links.dst[i])): share for i, share in route.items()}
    assert hops == {(0, 4): 0.5, (4, 8): 0.5, (0, 12): 0.5, (12, 8): 0.5,       # dim 0, both ways
                    (8, 9): 0.5, (9, 10): 0.5, (8, 11): 0.5, (11, 10): 0.5}    # dim 1 at row 2


def test_mesh_route_is_dimension_order():
    t = Mesh((3, 3), BW, LAT)
    route = t.route(0, 8)
    assert sorted((int(t.links.src[i]), int(t.links.dst[i])) for i in route) == [(0, 3), (3, 6), (6, 7), (7, 8)]
    assert set(route.values()) == {1.0}
    assert t.route(4, 4) == {}


# -- brute force on small instances ---------------------------------------------------------------

@pytest.mark.parametrize("wrap", [True, False])
@pytest.mark.parametrize("dims", SMALL)
def test_avg_hops_and_diameter_match_every_route(dims, wrap):
    t = make(dims, wrap)
    hops = [t.hops(s, d) for s, d in itertools.permutations(range(t.hosts), 2)]
    assert t.avg_hops() == pytest.approx(np.mean(hops), rel=1e-12)
    assert t.diameter() == max(hops)


@pytest.mark.parametrize("wrap", [True, False])
@pytest.mark.parametrize("dims", SMALL)
def test_dimension_order_routes_are_shortest_paths(dims, wrap):
    import rustworkx as rx
    t = make(dims, wrap)
    g = t.graph()
    assert g.num_edges() == t.cables  # a size-2 ring's two cables are two edges
    shortest = rx.distance_matrix(g)
    for s, d in itertools.permutations(range(t.hosts), 2):
        assert t.hops(s, d) == shortest[s, d]


@pytest.mark.parametrize("wrap", [True, False])
@pytest.mark.parametrize("dims", [(6,), (4, 4), (3, 4, 2)])
def test_every_route_carries_one_unit_from_source_to_destination(dims, wrap):
    t = make(dims, wrap)
    for s, d in itertools.permutations(range(t.hosts), 2):
        net = np.zeros(t.hosts)
        for link, share in t.route(s, d).items():
            net[t.links.src[link]] += share
            net[t.links.dst[link]] -= share
        expected = np.zeros(t.hosts)
        expected[s], expected[d] = 1.0, -1.0
        assert np.allclose(net, expected)


# -- vectorized loads against the per-pair reference ----------------------------------------------

@pytest.mark.parametrize("wrap", [True, False])
@pytest.mark.parametrize("dims", SMALL)
def test_link_loads_match_the_routes_for_random_demand(dims, wrap):
    t = make(dims, wrap)
    rng = np.random.default_rng(sum(dims) * 2 + wrap)
    demand = rng.random((t.hosts, t.hosts)) * rng.integers(0, 2, (t.hosts, t.hosts))  # sparse-ish
    np.fill_diagonal(demand, 0.0)
    expected = reference_loads(t, demand)
    assert np.allclose(t.router_link_loads(demand), expected, rtol=1e-12, atol=1e-12)
    s, d = np.nonzero(demand)
    assert np.allclose(t.flow_link_loads(s, d, demand[s, d]), expected, rtol=1e-12, atol=1e-12)
    assert np.allclose(t.link_loads(Traffic.from_flows(t, s, d, demand[s, d])), expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(dims=st.lists(st.integers(2, 5), min_size=1, max_size=3).filter(lambda ds: math.prod(ds) <= 30),
       wrap=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_link_loads_match_the_routes_for_any_shape(dims, wrap, seed):
    t = make(tuple(dims), wrap)
    rng = np.random.default_rng(seed)
    src = rng.integers(0, t.hosts, 40)
    dst = rng.integers(0, t.hosts, 40)  # repeats and self-flows included
    size = rng.random(40)
    demand = np.zeros((t.hosts, t.hosts))
    np.add.at(demand, (src, dst), np.where(src != dst, size, 0.0))
    expected = reference_loads(t, demand)
    assert np.allclose(t.router_link_loads(demand), expected, rtol=1e-12, atol=1e-12)
    assert np.allclose(t.flow_link_loads(src, dst, size), expected, rtol=1e-12, atol=1e-12)


# -- hand-computed traffic ------------------------------------------------------------------------

def test_tornado_on_a_ring_loads_only_the_clockwise_links():
    t = Torus((8,), BW, LAT)
    assert np.array_equal(t.links.src[:8], np.arange(8))              # plus links i -> i+1 first
    assert np.array_equal(t.links.dst[:8], (np.arange(8) + 1) % 8)
    plus, minus = plus_minus(t, t.link_loads(t.tornado_traffic(1e6)))
    assert np.array_equal(plus, np.full(8, 3e6))   # each node sends ceil(8/2)-1 = 3 ahead
    assert np.array_equal(minus, np.zeros(8))
    odd = Torus((7,), BW, LAT)       # ceil(7/2)-1 = 3 ahead, still the short way round
    plus, minus = plus_minus(odd, odd.link_loads(odd.tornado_traffic(1e6)))
    assert np.array_equal(plus, np.full(7, 3e6)) and np.array_equal(minus, np.zeros(7))


def test_tornado_on_a_torus_moves_in_every_dimension():
    t = Torus((4, 4), BW, LAT)       # shift 1 in both dimensions: one flow on every plus link
    loads = t.link_loads(t.tornado_traffic(2.0))
    plus = np.concatenate([loads[:16], loads[32:48]])
    minus = np.concatenate([loads[16:32], loads[48:]])
    assert np.array_equal(plus, np.full(32, 2.0)) and np.array_equal(minus, np.zeros(32))
    assert np.array_equal(t.link_loads(t.adversarial_traffic(2.0)), loads)


@pytest.mark.parametrize("k, per_link", [(8, 8.0), (5, 3.0), (6, 4.5)])
def test_all_to_all_on_a_ring_loads_every_link_equally(k, per_link):
    # Per source, plus-way hops: 1 + ... + (ceil(k/2)-1), plus half of k/2 for even k; k sources over
    # k plus links: k=8: 1+2+3+2 = 8; k=5: 1+2 = 3; k=6: 1+2+1.5 = 4.5 (k^2/8 for even k).
    t = Torus((k,), BW, LAT)
    plus, minus = plus_minus(t, t.link_loads(Traffic.all_to_all(t, 1.0)))
    assert np.allclose(plus, per_link) and np.allclose(minus, per_link)


def test_all_to_all_on_a_line_peaks_in_the_middle():
    t = Mesh((4,), BW, LAT)          # cable c carries (c+1)(k-1-c) flows each way
    plus, minus = plus_minus(t, t.link_loads(Traffic.all_to_all(t, 1.0)))
    assert np.array_equal(plus, [3.0, 4.0, 3.0]) and np.array_equal(minus, [3.0, 4.0, 3.0])


def test_tornado_completion_time_ring_vs_line():
    size = 1e9
    ring, line = Torus((8,), BW, LAT), Mesh((8,), BW, LAT)
    # Ring: 3 flows on every clockwise link; diameter 4.
    assert ring.completion_time_s(ring.tornado_traffic(size)) == pytest.approx(3 * size / BW + 4 * LAT)
    # Line: 0..4 go 3 ahead, 5..7 travel 5 back to 0..2; cables 2-4 carry 3 flows each way; diameter 7.
    plus, minus = plus_minus(line, line.link_loads(line.tornado_traffic(size)))
    assert np.array_equal(plus / size, [1, 2, 3, 3, 3, 2, 1])
    assert np.array_equal(minus / size, [1, 2, 3, 3, 3, 2, 1])
    assert line.completion_time_s(line.tornado_traffic(size)) == pytest.approx(3 * size / BW + 7 * LAT)


def test_mesh_adversarial_is_the_reflection():
    line = Mesh((8,), BW, LAT)       # i -> 7-i: the middle cable carries 4 flows each way
    plus, minus = plus_minus(line, line.link_loads(line.adversarial_traffic(1.0)))
    assert np.array_equal(plus, [1, 2, 3, 4, 3, 2, 1]) and np.array_equal(minus, plus)
    assert line.completion_time_s(line.adversarial_traffic(1e9)) == pytest.approx(4e9 / BW + 7 * LAT)
    mesh = Mesh((4, 4), BW, LAT)     # the middle cables of every line carry k/2 = 2 flows each way
    assert mesh.link_loads(mesh.adversarial_traffic(1.0)).max() == 2.0


def test_large_machines_match_the_closed_forms():
    for dims in [(8, 8, 8), (64, 64)]:
        t = Torus(dims, BW, LAT)
        loads = t.link_loads(Traffic.all_to_all(t, 1.0))
        # Symmetric all-to-all on k x k x ...: every link carries N * k/8 (N/k lines' sources, k^2/8 each).
        k = dims[0]
        assert np.allclose(loads, t.hosts * k / 8)
    big = Mesh((128, 128), BW, LAT)
    src = np.arange(big.hosts)
    loads = big.flow_link_loads(src, (src + 1) % big.hosts, 1.0)  # structured traffic, no dense demand
    # Hops: 128*127 flows step along a row; 127 row ends go down one and back 127; the last goes home.
    assert loads.sum() == pytest.approx(128 * 127 * 1 + 127 * 128 + 254)


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [(8, 1), (0,), (2.5,), (True, 4), 8])
def test_bad_dims_are_user_errors(dims):
    with pytest.raises(UserError, match=r"^fabric\.dims: "):
        Torus(dims, BW, LAT)


def test_empty_dims_and_bad_links_are_user_errors():
    with pytest.raises(UserError, match=r"^fabric\.dims: must list at least one"):
        Mesh((), BW, LAT)
    with pytest.raises(UserError, match=r"^fabric\.dims: every dimension must be >= 2"):
        Mesh((4, 1), BW, LAT)
    for bw in (0.0, -1.0):
        with pytest.raises(UserError, match=r"^fabric\.link_bw: must be positive"):
            Torus((4, 4), bw, LAT)
    with pytest.raises(UserError, match=r"^fabric\.link_latency: must be a finite duration >= 0"):
        Torus((4, 4), BW, -1e-6)


def _brute_force_bisection_cables(t) -> int:
    """Fewest cables across any split of the hosts into halves (sizes floor and ceil of N/2)."""
    import itertools

    n = t.hosts
    half = n // 2
    a, b = t.links.src, t.links.dst  # every cable crosses a cut once in each direction
    best = None
    for side in itertools.combinations(range(1, n), half - 1 if n % 2 == 0 else half):
        inside = np.zeros(n, bool)
        inside[[0, *side]] = True  # host 0 on the first side: each split counted once
        crossing = int(np.count_nonzero(inside[a] & ~inside[b]))
        best = crossing if best is None else min(best, crossing)
    return best


@pytest.mark.parametrize("dims, wrap", [
    ((5, 2), False), ((7, 2), False), ((5, 4), False), ((5, 4), True), ((3, 2), True), ((4, 4), True),
    ((4, 3), False), ((3, 3), True), ((8,), True), ((7,), False), ((2, 2, 3), True), ((2, 2, 2), False),
    ((5, 3), True),
])
def test_bisection_is_the_cheapest_equal_cut(dims, wrap):
    t = Torus(dims, BW, LAT, wraparound=wrap)
    assert t.bisection_bw_Bps() == _brute_force_bisection_cables(t) * BW


# -- collectives: the graph sets the times, not the order its dims are listed in ---------------------

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES_BYTES = (1.0, 2.0**16, 2.0**27)  # latency-bound to bandwidth-bound (128 MiB)
SHAPES = st.lists(st.integers(2, 6), min_size=1, max_size=3).filter(lambda ds: math.prod(ds) <= 32).map(tuple)


def turned(dims: tuple[int, ...], order: tuple[int, ...]) -> tuple[tuple[int, ...], list[int]]:
    """The same machine with its dims listed in `order`, and where each host of `dims` is in it."""
    coords = np.unravel_index(np.arange(math.prod(dims)), dims)
    new = tuple(dims[d] for d in order)
    return new, np.ravel_multi_index(tuple(coords[d] for d in order), new).tolist()


def auto_times(topology: Torus, ranks: list[int] | None = None) -> np.ndarray:
    """`auto`'s time of every op and size over every host, rank i on host ranks[i] (default: host i)."""
    c = Collectives(topology)
    groups = [list(range(topology.hosts)) if ranks is None else ranks]
    return np.array([c.time_s(op, size, groups) for op in OPS for size in SIZES_BYTES])


def test_a_2x4_torus_all_reduces_as_fast_as_a_4x2_and_no_slower_than_a_ring_of_8():
    # 128 MiB over 8 chips, 112.5 GB/s links (an H100's 450 GB/s over a 2D torus chip's 4 ports), 0.6 us a hop.
    size, bw, lat = 128 * 2**20, 112.5e9, 0.6e-6
    times = {dims: Collectives(Torus(dims, bw, lat)).time_s("all_reduce", size, [list(range(8))])
             for dims in [(8,), (4, 2), (2, 4)]}
    # The ring of 8 both ways round puts 2 x 7/16 of the message on every busy link (reduce-scatter, then
    # all-gather), 7 steps of 1/16 each way, 14 one-hop steps. The 2D bucket runs two shards of a half in
    # two phases: the 2 (whose two cables take a half each: 1/4 of a shard) along one while the other goes
    # 3 steps along the 4 (3/8), then each the other axis (1/16 and 3/16 on what is left): 3/8 + 3/16 of a
    # half, 9/32 a link each way, 3 + 3 steps.
    ring_beta_s, bucket_beta_s = (2 * share * size / (bw * SCALEUP_BW_EFFICIENCY) for share in (7 / 16, 9 / 32))
    assert times[(8,)] == pytest.approx(BASE_LATENCY_S + 14 * lat + ring_beta_s, rel=1e-12)
    assert times[(4, 2)] == pytest.approx(BASE_LATENCY_S + 12 * lat + bucket_beta_s, rel=1e-12)
    assert times[(2, 4)] == pytest.approx(times[(4, 2)], rel=1e-12)
    assert times[(4, 2)] < times[(8,)]
    assert times[(8,)] == pytest.approx(1.2846e-3, rel=1e-4)


@settings(max_examples=30, deadline=None)
@given(dims=SHAPES, data=st.data())
def test_listing_a_torus_or_meshs_dims_in_another_order_changes_no_collective(dims, data):
    order = data.draw(st.permutations(range(len(dims))))
    new, where = turned(dims, tuple(order))
    everyone = list(range(math.prod(dims)))
    # The algorithms laid out by the shape (bucket, all-to-all) cost the same on the same chips. (A tree's
    # multi-hop flows are routed dimension by dimension in the order listed, so their sharing may differ.)
    for wrap in (True, False):
        before, after = Collectives(make(dims, wrap)), Collectives(make(new, wrap))
        for op, algorithm in [("all_reduce", "bucket"), ("all_gather", "bucket"), ("reduce_scatter", "bucket"),
                              ("all_to_all", "direct")]:
            a, b = before.cost(op, [everyone], algorithm), after.cost(op, [where], algorithm)
            assert b.alpha_s == pytest.approx(a.alpha_s, rel=1e-12, abs=0)
            assert b.beta_s_per_byte == pytest.approx(a.beta_s_per_byte, rel=1e-12, abs=0)
    # On a torus the fastest algorithm over the same chips, each with the same rank, does not depend on the
    # order the dims are listed in. (Which chip has which rank does matter: a tree's parent and child are
    # ranks apart, so a 2x6 torus in host order runs a 1 KiB all-reduce on its tree, a 6x2 on its bucket.)
    np.testing.assert_allclose(auto_times(make(new, True), where), auto_times(make(dims, True), everyone),
                               rtol=1e-12, atol=0)


@settings(max_examples=30, deadline=None)
@given(dims=SHAPES)
def test_adding_links_never_slows_a_collective(dims):
    n = math.prod(dims)
    torus = auto_times(make(dims, True))
    # A torus of n chips is a ring of n plus more links, and its mesh plus the wrap cables.
    assert np.all(torus <= auto_times(Torus((n,), BW, LAT)) * (1 + 1e-12))
    assert np.all(torus <= auto_times(make(dims, False)) * (1 + 1e-12))


@settings(max_examples=20, deadline=None)
@given(dims=SHAPES, wrap=st.booleans(), faster=st.floats(1.0, 8.0))
def test_more_link_bandwidth_never_slows_a_collective(dims, wrap, faster):
    slow = auto_times(Torus(dims, BW, LAT, wraparound=wrap))
    fast = auto_times(Torus(dims, BW * faster, LAT, wraparound=wrap))
    assert np.all(fast <= slow * (1 + 1e-12))
