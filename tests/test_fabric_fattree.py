"""FatTree: closed forms against textbook numbers and brute force, ECMP link loads against per-pair routes."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from tokenpath.config.errors import UserError
from tokenpath.fabric.fattree import FatTree
from tokenpath.fabric.topology import Traffic

B = 100e9       # link_bw_Bps
LAT = 1e-6      # link_latency_s


def tree(k: int, levels: int = 3, over: tuple[float, ...] | None = None, latency_s: float = LAT) -> FatTree:
    return FatTree(k, B, latency_s, levels=levels, oversubscription=over)


def route_loads(t: FatTree, src: np.ndarray, dst: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The reference: every flow's bytes times its per-pair route fractions."""
    loads = np.zeros(len(t.links))
    for s, d, b in zip(src.tolist(), dst.tolist(), size.tolist()):
        for link, fraction in t.route(s, d).items():
            loads[link] += b * fraction
    return loads


# -- structure ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, levels, hosts, switches, cables, routers, diameter, avg_hops", [
    # 3 levels: k^3/4 hosts, 5k^2/4 switches, 3k^3/4 cables (host cables included).
    (2, 3, 2, 5, 6, 2, 6, Fraction(6)),
    # k=4, from one host: 1 on its edge (2 links), 2 in its pod (4), 12 elsewhere (6): (2+8+72)/15.
    (4, 3, 16, 20, 48, 8, 6, Fraction(82, 15)),
    # k=6: 2 on its edge, 6 in its pod, 45 elsewhere: (4+24+270)/53.
    (6, 3, 54, 45, 162, 18, 6, Fraction(298, 53)),
    # Al-Fares et al. 2008: 48-port switches give 27,648 hosts and 2,880 switches.
    (48, 3, 27_648, 2_880, 82_944, 1_152, 6, Fraction(2 * 23 + 4 * 552 + 6 * (27_648 - 576), 27_647)),
    (64, 3, 65_536, 5_120, 196_608, 2_048, 6, Fraction(391_102, 65_535)),
    # 2 levels: k^2/2 hosts, 3k/2 switches, k^2 cables.
    (2, 2, 2, 3, 4, 2, 4, Fraction(4)),
    # k=4, from one host: 1 on its leaf (2 links), 6 elsewhere (4): 26/7.
    (4, 2, 8, 6, 16, 4, 4, Fraction(26, 7)),
    (64, 2, 2_048, 96, 4_096, 64, 4, Fraction(2 * 31 + 4 * (2_048 - 32), 2_047)),
])
def test_closed_forms_match_textbook_numbers(k, levels, hosts, switches, cables, routers, diameter, avg_hops):
    t = tree(k, levels)
    assert (t.hosts, t.switches, t.cables, t.routers) == (hosts, switches, cables, routers)
    assert t.diameter() == diameter
    assert t.avg_hops() == pytest.approx(float(avg_hops), rel=1e-12)
    assert t.bisection_bw_Bps() == hosts / 2 * B
    assert t.tier_names == (("host", "edge-agg", "agg-core") if levels == 3 else ("host", "leaf-spine"))


@pytest.mark.parametrize("k, levels", [(2, 3), (4, 3), (6, 3), (2, 2), (6, 2)])
def test_wiring_contract(k, levels):
    """Host cables come first; router r is node hosts + r; every switch uses exactly its k ports."""
    t = tree(k, levels, over=(2.0,) * (levels - 1))
    h, m = t.hosts, k // 2
    assert np.array_equal(t.host_router, np.arange(h) // m)
    for host in range(h):
        up, down = t.host_links(host)
        assert (t.links.src[up], t.links.dst[up]) == (host, h + host // m)
        assert (t.links.src[down], t.links.dst[down]) == (h + host // m, host)
    degree = np.bincount(t.links.src, minlength=h + t.switches)
    assert np.all(degree[:h] == 1)
    assert np.all(degree[h:] == k)
    # Link tiers and bandwidths: host links full rate, switch tiers at link_bw / 2.
    assert np.all(t.links.tier[: 2 * h] == 0)
    assert np.array_equal(np.unique(t.links.tier), np.arange(levels))
    assert np.all(t.links.bw_Bps[: 2 * h] == B)
    assert np.all(t.links.bw_Bps[2 * h:] == B / 2)
    assert np.all(t.links.latency_s == LAT)


@pytest.mark.parametrize("k, levels, over, expected", [
    # k=4: 16 hosts; any tier cut crosses 8 links, at B / ratio.
    (4, 3, None, 8 * B),
    (4, 3, (1, 2), 4 * B),        # 8 agg-core links of B/2 between two halves of pods
    (4, 3, (2, 1), 4 * B),        # 8 edge-agg links of B/2 between two halves of the edges
    (4, 3, (2, 4), 2 * B),
    (4, 3, (1.5, 1), 8 * B / 1.5),
    # leaf-spine k=4: 8 hosts; two leaves' 4 uplinks.
    (4, 2, None, 4 * B),
    (4, 2, (2,), 2 * B),
])
def test_bisection_hand_computed(k, levels, over, expected):
    assert tree(k, levels, over).bisection_bw_Bps() == pytest.approx(expected)


def _min_bisection_by_max_flow(t: FatTree, unit_Bps: float) -> float:
    """Min over equal host splits of the max flow from one half to the other (= min cut, one direction).

    Hosts of one router, routers of one pod, and pods are each interchangeable (automorphisms keep the
    cut's capacity), so a split is fixed up to symmetry by the sorted count of side-A hosts per router
    within each pod, and the sorted list of those pod states."""
    import scipy.sparse as sparse
    import scipy.sparse.csgraph as csgraph
    m, h = t.k // 2, t.hosts
    per_pod = t.routers // t.pods
    n = h + t.switches
    source, sink = n, n + 1
    cap = np.rint(t.links.bw_Bps / unit_Bps).astype(np.int32)
    assert np.allclose(cap * unit_Bps, t.links.bw_Bps)
    best = None
    pod_states = list(itertools.combinations_with_replacement(range(m + 1), per_pod))
    for pods in itertools.combinations_with_replacement(pod_states, t.pods):
        counts = [c for pod in pods for c in pod]
        if sum(counts) != h // 2:
            continue
        side_a = np.array([r * m + i for r, c in enumerate(counts) for i in range(c)])
        side_b = np.setdiff1d(np.arange(h), side_a)
        rows = np.concatenate([t.links.src, np.full(len(side_a), source), side_b])
        cols = np.concatenate([t.links.dst, side_a, np.full(len(side_b), sink)])
        data = np.concatenate([cap, np.full(h, 10**6, np.int32)])
        graph = sparse.csr_matrix((data, (rows, cols)), shape=(n + 2, n + 2))
        flow = csgraph.maximum_flow(graph, source, sink).flow_value
        best = flow if best is None else min(best, flow)
    return best * unit_Bps


@pytest.mark.parametrize("k, levels, over", [
    (2, 3, (1, 4)), (4, 3, None), (4, 3, (1, 2)), (4, 3, (2, 1)), (4, 3, (2, 4)),
    (4, 2, None), (6, 2, (4,)), (8, 2, (2,)),
])
def test_bisection_equals_brute_force_min_cut(k, levels, over):
    t = FatTree(k, 4.0, 0.0, levels=levels, oversubscription=over)
    assert t.bisection_bw_Bps() == _min_bisection_by_max_flow(t, 1.0)


@pytest.mark.parametrize("k, levels", [(4, 3), (6, 3), (4, 2), (6, 2)])
def test_hops_brute_force_and_shortest_paths(k, levels):
    import rustworkx as rx
    t = tree(k, levels)
    dist = rx.distance_matrix(t.graph())
    pairs = [(s, d) for s in range(t.hosts) for d in range(t.hosts) if s != d]
    # hops() is the fraction-weighted link count; with flow conserved along each route (tested below)
    # it equals the shortest distance only if every path the route splits over is a shortest path.
    hops = np.array([t.hops(s, d) for s, d in pairs])
    shortest = np.array([dist[s, d] for s, d in pairs])
    np.testing.assert_allclose(hops, shortest, rtol=1e-12)
    assert hops.mean() == pytest.approx(t.avg_hops(), rel=1e-12)
    assert round(hops.max()) == t.diameter()
    hops = np.rint(hops).astype(int)
    # Every route uses exactly hops(s, d) links per parallel path: 2, 4 or 6 links in 1, k/2, (k/2)^2 paths.
    m = k // 2
    sizes = {2: 2, 4: 2 + 2 * m, 6: 2 + 2 * m + 2 * m * m}
    assert all(len(t.route(s, d)) == sizes[hop] for (s, d), hop in zip(pairs, hops.tolist()))
    assert t.hops(3, 3) == 0 and t.route(3, 3) == {}


# -- routing ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, levels", [(2, 3), (4, 3), (6, 3), (2, 2), (4, 2), (6, 2)])
def test_route_fractions_per_tier_and_conservation(k, levels):
    """Out of each source, the fractions on each tier's up links and down links each sum to 1 (or 0 where
    the route turns below that tier), every link carries 1/(paths through its tier), and flow is
    conserved at every switch."""
    t = tree(k, levels)
    links, h, m = t.links, t.hosts, k // 2
    up = links.src < links.dst     # node ids grow host -> edge -> agg -> core
    for s in range(h):
        for d in range(h):
            if s == d:
                continue
            route = t.route(s, d)
            idx = np.fromiter(route, np.int64)
            frac = np.fromiter(route.values(), np.float64)
            top = round(t.hops(s, d)) // 2   # highest tier used
            for tier in range(levels):
                expected = 1.0 if tier < top else 0.0
                on_tier = links.tier[idx] == tier
                assert frac[on_tier & up[idx]].sum() == pytest.approx(expected)
                assert frac[on_tier & ~up[idx]].sum() == pytest.approx(expected)
                assert np.allclose(frac[on_tier], [1.0, 1.0 / m, 1.0 / m ** 2][tier])
            net = np.bincount(links.dst[idx], frac, h + t.switches) - np.bincount(links.src[idx], frac, h + t.switches)
            expected_net = np.zeros(h + t.switches)
            expected_net[s], expected_net[d] = -1.0, 1.0
            assert np.allclose(net, expected_net)


@pytest.mark.parametrize("k, levels, over", [
    (2, 3, None), (4, 3, None), (4, 3, (2, 3)), (6, 3, (1, 4)), (4, 2, None), (6, 2, (3,)), (8, 2, (2,)),
])
def test_link_loads_equal_sum_of_routes(k, levels, over):
    t = tree(k, levels, over)
    rng = np.random.default_rng(1000 * k + levels)
    n = 400
    src = rng.integers(0, t.hosts, n)
    dst = rng.integers(0, t.hosts, n)     # includes some src == dst flows, which move nothing
    size = rng.uniform(1.0, 1e6, n)
    loads = t.link_loads(Traffic.from_flows(t, src, dst, size))
    np.testing.assert_allclose(loads, route_loads(t, src, dst, size), rtol=1e-10, atol=1e-6)
    assert loads.sum() > 0


@pytest.mark.parametrize("k, levels", [(4, 3), (6, 3), (6, 2)])
def test_router_turnaround_loads_no_switch_link(k, levels):
    t = tree(k, levels)
    demand = np.diag(np.arange(1.0, t.routers + 1))
    assert not t.router_link_loads(demand).any()
    with pytest.raises(ValueError, match="router_bytes"):
        t.router_link_loads(np.zeros((t.routers + 1, t.routers)))


def test_all_to_all_k4_hand_computed():
    b = 1000.0
    t = tree(4, 3)
    loads = t.link_loads(Traffic.all_to_all(t, b))
    tier = t.links.tier
    # 16 hosts. Host link: each host sends to (and receives from) the 15 others: 15b.
    assert np.all(loads[tier == 0] == 15 * b)
    # Edge-agg: 2 hosts on an edge each send to the 14 hosts off that edge = 28b, over 2 uplinks: 14b.
    assert np.all(loads[tier == 1] == 14 * b)
    # Agg-core: 4 hosts in a pod each send to the 12 hosts outside = 48b, over 4 agg-core uplinks: 12b.
    assert np.all(loads[tier == 2] == 12 * b)
    assert np.count_nonzero(tier == 2) == 2 * 16   # 16 agg-core cables
    # Busiest link is a host link: 15b over B, plus 6 hops of latency.
    assert t.completion_time_s(Traffic.all_to_all(t, b)) == pytest.approx(15 * b / B + 6 * LAT)

    leaf_spine = tree(4, 2, over=(2,))
    loads = leaf_spine.link_loads(Traffic.all_to_all(leaf_spine, b))
    tier = leaf_spine.links.tier
    # 8 hosts: host links 7b; a leaf's 2 hosts send to the 6 remote hosts = 12b over 2 uplinks: 6b.
    assert np.all(loads[tier == 0] == 7 * b)
    assert np.all(loads[tier == 1] == 6 * b)
    # Leaf-spine links run at B/2: 6b / (B/2) = 12b/B beats the host links' 7b/B.
    assert leaf_spine.completion_time_s(Traffic.all_to_all(leaf_spine, b)) == pytest.approx(12 * b / B + 4 * LAT)


def test_all_to_all_on_65536_hosts_matches_the_closed_form():
    """65,536 hosts: host links carry hosts-1, edge-agg hosts-k/2, agg-core hosts-(k/2)^2 bytes per byte
    per pair."""
    t = tree(64, 3)
    loads = t.link_loads(Traffic.all_to_all(t, 1.0))
    h = 65_536
    tier = t.links.tier
    assert len(loads) == 6 * h
    assert np.all(loads[tier == 0] == h - 1)
    assert np.all(loads[tier == 1] == h - 32)
    assert np.all(loads[tier == 2] == h - 32 * 32)


@pytest.mark.parametrize("k, levels", [(2, 3), (4, 3), (6, 3), (8, 3), (2, 2), (4, 2), (8, 2)])
def test_adversarial_traffic_climbs_to_top_and_oversubscription_doubles_time(k, levels):
    b = 1e6
    plain = tree(k, levels, latency_s=0.0)
    top = (1.0,) * (levels - 2) + (2.0,)
    tapered = tree(k, levels, over=top, latency_s=0.0)
    traffic = plain.adversarial_traffic(b)
    # A permutation: every host sends b once and receives b once, never to its own pod / leaf.
    assert np.all(traffic.host_out_bytes == b) and np.all(traffic.host_in_bytes == b)
    assert traffic.router_bytes.sum() == plain.hosts * b
    per_pod = plain.routers // plain.pods if levels == 3 else 1
    pod = np.arange(plain.routers) // per_pod
    assert not traffic.router_bytes[pod[:, None] == pod[None, :]].any()
    # Every top-tier link carries exactly b.
    loads = plain.link_loads(traffic)
    assert np.all(loads[plain.links.tier == levels - 1] == b)
    # Busiest link b / B at 1:1; top links at B/2 under 2:1 -> exactly twice the time.
    assert plain.completion_time_s(traffic) == pytest.approx(b / B)
    assert tapered.completion_time_s(tapered.adversarial_traffic(b)) == pytest.approx(2 * b / B)
    # The bound matches the bisection: half the hosts' bytes over the bisection bandwidth.
    for t in (plain, tapered):
        assert t.completion_time_s(traffic) == pytest.approx(t.hosts / 2 * b / t.bisection_bw_Bps())
    # With latency the bound adds diameter * latency to the same busy time.
    slow = tree(k, levels, over=top, latency_s=LAT)
    assert slow.completion_time_s(traffic) == pytest.approx(2 * b / B + 2 * levels * LAT)


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    ({"k": 5}, "fabric.k"),
    ({"k": 1}, "fabric.k"),
    ({"k": 0}, "fabric.k"),
    ({"k": -4}, "fabric.k"),
    ({"k": 4.0}, "fabric.k"),
    ({"levels": 1}, "fabric.levels"),
    ({"levels": 4}, "fabric.levels"),
    ({"levels": True}, "fabric.levels"),
    ({"levels": 3, "oversubscription": (2.0,)}, "fabric.oversubscription"),
    ({"levels": 2, "oversubscription": (1.0, 1.0)}, "fabric.oversubscription"),
    ({"levels": 3, "oversubscription": ()}, "fabric.oversubscription"),
    ({"levels": 3, "oversubscription": 2.0}, "fabric.oversubscription"),
    ({"levels": 3, "oversubscription": (1.0, 0.5)}, "fabric.oversubscription"),
    ({"levels": 2, "oversubscription": (0,)}, "fabric.oversubscription"),
    ({"levels": 2, "oversubscription": (float("nan"),)}, "fabric.oversubscription"),
    ({"levels": 2, "oversubscription": (float("inf"),)}, "fabric.oversubscription"),
    ({"levels": 2, "oversubscription": ("2",)}, "fabric.oversubscription"),
    ({"link_bw_Bps": 0.0}, "fabric.link_bw"),
    ({"link_bw_Bps": -1e9}, "fabric.link_bw"),
    ({"link_latency_s": -1e-6}, "fabric.link_latency"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = {"k": 4, "link_bw_Bps": B, "link_latency_s": LAT} | kwargs
    with pytest.raises(UserError) as err:
        FatTree(**args)
    message = str(err.value)
    assert message.startswith(field + ":")
    assert "\n" not in message


def test_valid_edge_cases_accepted():
    t = FatTree(np.int64(4), B, 0.0, levels=3, oversubscription=[1, np.float64(3.0)])
    assert t.oversubscription == (1.0, 3.0)
    assert t.bisection_bw_Bps() == 8 * B / 3
    with pytest.raises(UserError, match="route"):
        t.route(0, t.hosts)
