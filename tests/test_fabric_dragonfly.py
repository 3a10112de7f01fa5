"""DragonFly: closed forms against hand counts and brute force, vectorized loads against the per-pair
reference routes, hand-computed loads for uniform and adversarial traffic, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.config.errors import UserError
from tokenpath.fabric.dragonfly import DragonFly
from tokenpath.fabric.topology import Traffic

BW = 1.0


def _df(p, a=None, h=None, g=None, routing="min", **kw) -> DragonFly:
    return DragonFly(p, BW, 1e-7, a=a, h=h, g=g, routing=routing, **kw)


def _tier(t: DragonFly, loads: np.ndarray, name: str) -> np.ndarray:
    return loads[t.links.tier == t.tier_names.index(name)]


def _reference_loads(t: DragonFly, src, dst, size) -> np.ndarray:
    """Sum over flows of bytes x route fractions: what `link_loads` must equal."""
    loads = np.zeros(len(t.links))
    for s, d, w in zip(src.tolist(), dst.tolist(), size.tolist()):
        for link, frac in t.route(s, d).items():
            loads[link] += w * frac
    return loads


def _path_lengths(t: DragonFly, s: int, d: int) -> set[int]:
    """Lengths of every path through the route's links (several with parallel global links)."""
    out: dict[int, list[int]] = {}
    for link in t.route(s, d):
        out.setdefault(int(t.links.src[link]), []).append(int(t.links.dst[link]))
    lengths, stack = set(), [(s, 0)]
    while stack:
        node, n = stack.pop()
        if node == d:
            lengths.add(n)
            continue
        stack.extend((nxt, n + 1) for nxt in out[node])
    return lengths


# -- closed forms against hand counts -----------------------------------------------------------------
# (p, a, h, g) -> hosts, routers, cables (host + local + global), diameter, avg_hops, bisection links.
# avg_hops per source: p-1 on its router (2 links), p(a-1) in its group (3), pa(g-1) elsewhere at
# 3 + 2(a-1)/a on average; over hosts-1 destinations.
HAND = [
    # balanced largest, p = 1: a=2, h=1, g=3; 3 groups, one cable each; (3*1 + 4*4) / 5.
    ((1, None, None, None), 6, 6, 6 + 3 * 1 + 3, 5, 19 / 5, 1 * 2),
    # balanced largest, p = 2: a=4, h=2, g=9; local 6 per group, global 9*8/2; (2 + 18 + 64*4.5) / 71.
    ((2, None, None, None), 72, 36, 72 + 9 * 6 + 36, 5, 308 / 71, 4 * 5),
    # g < a*h+1: a*h = 4 ports over 2 other groups, 2 links per pair; cut 1 group | 2 groups = 2 pairs.
    ((1, 2, 2, 3), 6, 6, 6 + 3 + 3 * 2, 5, 19 / 5, 2 * 2),
    # a*h = 8 ports, g-1 = 5 offsets: 1 each, then the 3 spare ports take offsets 1, 5 and 3 (= g/2):
    # offsets 1, 3, 5 have 2 links, 2 and 4 one; all 8 ports used, 6*8/2 cables. Cut {0,1,2}|{3,4,5}:
    # offsets 3,4,5 / 2,3,4 / 1,2,3 from groups 0 / 1 / 2 = (2+1+2) + (1+2+1) + (2+1+2) = 14 links.
    ((1, 4, 2, 6), 24, 24, 24 + 6 * 6 + 24, 5, (3 * 3 + 20 * (3 + 1.5)) / 23, 14),
    # a*h = 3 ports, 2 offsets: one spare port, g odd, so it stays unused: 3 cables.
    ((1, 3, 1, 3), 9, 9, 9 + 3 * 3 + 3, 5, (3 * 2 + 6 * (3 + 4 / 3)) / 8, 1 * 2),
    # a = 1: a group is one router, no local links; routes are host, global, host.
    ((2, 1, 3, 4), 8, 4, 8 + 0 + 6, 3, (2 * 1 + 3 * 6) / 7, 2 * 2),
]


@pytest.mark.parametrize(("shape", "hosts", "routers", "cables", "diameter", "avg", "cut_links"), HAND)
def test_closed_forms_match_hand_counts(shape, hosts, routers, cables, diameter, avg, cut_links):
    t = _df(*shape, global_bw_Bps=3.0)
    assert (t.hosts, t.routers, t.switches, t.cables) == (hosts, routers, routers, cables)
    assert t.diameter() == diameter
    assert t.avg_hops() == pytest.approx(avg, rel=1e-12)
    # The global links (3.0 each) across the group halves, unless half the host links (BW each) are less.
    assert t.bisection_bw_Bps() == pytest.approx(min(cut_links * 3.0, hosts // 2 * BW))
    assert t.tier_names == ("host", "local", "global") and t.kind == "dragonfly"


def test_defaults_are_the_balanced_largest_dragonfly():
    t = _df(3)
    assert (t.a, t.h, t.g) == (6, 3, 19)
    assert (t.hosts, t.routers) == (3 * 6 * 19, 6 * 19)
    # Exactly one global link between every ordered pair of groups, none from a group to itself.
    i, k = np.meshgrid(np.arange(19), np.arange(19), indexing="ij")
    links = t.global_links(i, k)
    assert links.shape == (19, 19, 1)
    assert (links[i != k] >= 0).all() and (links[i == k] == -1).all()
    assert len(np.unique(links[i != k])) == 19 * 18


def test_relative_wiring_is_consistent():
    """Classic case: router x of group i reaches groups i+xh+1 .. i+xh+h and lands on router a-1-x."""
    t = _df(2)
    a, h, g = t.a, t.h, t.g
    for i in range(g):
        for x in range(a):
            for s in range(h):
                k = (i + x * h + s + 1) % g
                link = int(t.global_links(i, k)[0])
                assert t.links.src[link] == t.hosts + i * a + x
                assert t.links.dst[link] == t.hosts + k * a + (a - 1 - x)
                assert t.links.tier[link] == 2


@pytest.mark.parametrize("shape", [(1, 2, 2, 3), (1, 4, 2, 6), (1, 3, 1, 3), (2, 3, 2, 4), (1, 3, 3, 2)])
def test_every_global_cable_pairs_consistent_ports(shape):
    """The links i -> k are exactly the reverses of the links k -> i; no router uses more than h ports."""
    t = _df(*shape)
    for i in range(t.g):
        for k in range(t.g):
            if i == k:
                continue
            ik = [link for link in t.global_links(i, k).tolist() if link >= 0]
            ki = [link for link in t.global_links(k, i).tolist() if link >= 0]
            assert len(ik) == len(ki) == t.links_between(i, k) >= 1
            fwd = sorted(zip(t.links.src[ik].tolist(), t.links.dst[ik].tolist()))
            back = sorted(zip(t.links.dst[ki].tolist(), t.links.src[ki].tolist()))
            assert fwd == back
    glob = t.links.tier == 2
    assert np.bincount(t.links.src[glob] - t.hosts, minlength=t.routers).max() <= t.h


# -- brute force ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, None, None, None), (2, None, None, None), (1, 3, 2, 7), (2, 1, 3, 4)])
def test_avg_hops_and_diameter_equal_brute_force_over_min_routes(shape):
    t = _df(*shape)
    hops = [t.hops(s, d) for s in range(t.hosts) for d in range(t.hosts) if s != d]
    assert t.avg_hops() == pytest.approx(np.mean(hops), rel=1e-12)
    assert t.diameter() == max(hops)


@pytest.mark.parametrize("shape", [(1, 2, 2, 3), (1, 4, 2, 6), (1, 3, 1, 3)])
def test_parallel_links_avg_hops_weighs_routes_by_share(shape):
    """With parallel global links a pair's routes differ in length: avg_hops is the share-weighted mean
    (the sum of the route's fractions) and the diameter the longest path."""
    t = _df(*shape)
    pairs = [(s, d) for s in range(t.hosts) for d in range(t.hosts) if s != d]
    weighted = [sum(t.route(s, d).values()) for s, d in pairs]
    assert t.avg_hops() == pytest.approx(np.mean(weighted), rel=1e-12)
    assert t.diameter() == max(max(_path_lengths(t, s, d)) for s, d in pairs)


def test_min_routes_are_not_always_shortest_paths():
    """p=1, a=3, h=2, g=7: host 19 (group 6, router 1) to host 16 (group 5, router 1). MIN goes local to
    router 2 (which holds offsets 5, 6, so the link to group 5), global, lands on router a-1-2 = 0 of
    group 5, local to router 1: 5 links. But router 1 of group 6 reaches group 2 (offset 3) directly,
    landing on router 1 there, which reaches group 5 (offset 3) landing on router 1 = host 16's router:
    host, global, global, host = 4 links. Generic shortest paths would route over two global links."""
    import rustworkx as rx

    t = _df(1, 3, 2, 7)
    dist = rx.distance_matrix(t.graph())
    assert t.hops(19, 16) == 5
    assert dist[19, 16] == 4
    shorter = [(s, d) for s in range(t.hosts) for d in range(t.hosts) if s != d and dist[s, d] < t.hops(s, d)]
    assert (19, 16) in shorter
    assert all(dist[s, d] <= t.hops(s, d) for s in range(t.hosts) for d in range(t.hosts) if s != d)


# -- vectorized loads against the reference routes ------------------------------------------------------
SHAPES = [(1, None, None, None), (2, None, None, None), (1, 2, 2, 3), (1, 4, 2, 6), (1, 3, 1, 3),
          (2, 3, 2, 4), (2, 1, 3, 4), (1, 4, 2, 7)]


@pytest.mark.parametrize("routing", ["min", "valiant", "ugal"])
@pytest.mark.parametrize("shape", SHAPES)
def test_link_loads_equal_sum_of_routes_for_random_demand(shape, routing):
    t = _df(*shape, routing=routing)
    rng = np.random.default_rng(sum(x or 0 for x in shape) * 7 + len(routing))
    n, flows = t.hosts, 300
    src, dst = rng.integers(0, n, flows), rng.integers(0, n, flows)
    size = rng.random(flows)
    if routing == "ugal":
        # Light background plus a heavy shift from the first half of the groups to their next group:
        # some pairs should go Valiant, the rest MIN.
        heavy = np.arange(t.p * t.a * max(1, t.g // 2))
        src, dst = np.concatenate([src, heavy]), np.concatenate([dst, (heavy + t.p * t.a) % n])
        size = np.concatenate([size * 0.01, np.ones(len(heavy))])
    loads = t.link_loads(Traffic.from_flows(t, src, dst, size))
    np.testing.assert_allclose(loads, _reference_loads(t, src, dst, size), rtol=1e-10, atol=1e-12)
    if routing == "ugal" and t.g >= 6:
        assert 0 < t.ugal_valiant.sum() < t.g * (t.g - 1)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 2), a=st.integers(1, 4), h=st.integers(1, 3), data=st.data())
def test_loads_equal_routes_for_any_small_shape_and_routing(p, a, h, data):
    g = data.draw(st.integers(3, a * h + 1)) if a * h >= 2 else 2
    routing = data.draw(st.sampled_from(["min", "valiant", "ugal"])) if g >= 3 else "min"
    t = _df(p, a, h, g, routing=routing)
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    src = rng.integers(0, t.hosts, 40)
    dst = rng.integers(0, t.hosts, 40)
    size = rng.random(40)
    loads = t.link_loads(Traffic.from_flows(t, src, dst, size))  # fixes UGAL's choices for `route`
    np.testing.assert_allclose(loads, _reference_loads(t, src, dst, size), rtol=1e-10, atol=1e-12)


# -- hand-computed loads --------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2, 4])
def test_uniform_all_to_all_min_balanced_largest(p):
    """One link per pair of groups: each carries its groups' (pa)^2 host pairs. A local link x -> y carries
    its p^2 direct pairs, x's bytes to the h groups y reaches (h * p * pa) and the bytes of the h groups
    landing on x to router y (h * pa * p): p^2 (1 + 2ha)."""
    t = _df(p)
    a, h = t.a, t.h
    loads = t.link_loads(Traffic.all_to_all(t, 2.0))
    np.testing.assert_allclose(_tier(t, loads, "global"), (p * a) ** 2 * 2.0)
    np.testing.assert_allclose(_tier(t, loads, "local"), p * p * (1 + 2 * h * a) * 2.0)
    np.testing.assert_allclose(_tier(t, loads, "host"), (t.hosts - 1) * 2.0)


def test_uniform_all_to_all_valiant_doubles_global_load():
    """Every inter-group byte crosses two global links under Valiant, spread evenly on the balanced
    largest dragonfly: 2 (pa)^2 per link, and UGAL keeps uniform traffic MIN."""
    t = _df(2, routing="valiant")
    traffic = Traffic.all_to_all(t, 1.0)
    np.testing.assert_allclose(_tier(t, t.link_loads(traffic), "global"), 2 * 8 ** 2)
    u = _df(2, routing="ugal")
    np.testing.assert_allclose(u.link_loads(traffic), _df(2).link_loads(traffic))
    assert not u.ugal_valiant.any()
    assert not u.ugal_valiant_pairs(traffic.router_bytes).any()


def test_adversarial_traffic_min_valiant_ugal():
    """p=2, a=4, h=2, g=9, 1 byte per host. MIN: group i's p*a = 8 hosts all cross the one link to group
    i+1 (8 bytes; 9 such links, the other 63 idle). Its gateway is router 0 (offset 1 is port 0) and it
    lands on router a-1 = 3 of group i+1, so local links x -> 0 carry p = 2 bytes (x = 1, 2), 3 -> y too
    (y = 1, 2) and 3 -> 0 both: 4.
    Valiant: each pair's 8 bytes split over g-2 = 7 intermediate groups; a global link of offset d != 1
    carries leg 1 of one pair and leg 2 of another, 2*8/7; offset-1 links carry nothing. The busiest
    local links (v -> v+1 inside an intermediate group, plus first and last hops) also reach 2pab/(g-2)
    = 16/7 when a = 2h. Max load drops from 8 to 16/7: a ratio of (g-2)/2 = 3.5. UGAL sends exactly the
    9 loaded pairs Valiant (8 per link > 4 * mean MIN load 72/72) and matches Valiant."""
    t = _df(2)
    traffic = t.adversarial_traffic(1.0)
    loads = t.link_loads(traffic)
    glob, local = _tier(t, loads, "global"), _tier(t, loads, "local")
    assert sorted(np.unique(glob).tolist()) == [0.0, 8.0] and (glob == 8.0).sum() == 9
    for i in range(9):
        assert loads[t.global_links(i, (i + 1) % 9)[0]] == 8.0
    assert (local == 2.0).sum() == 36 and (local == 4.0).sum() == 9 and (local == 0).sum() == 63
    np.testing.assert_allclose(_tier(t, loads, "host"), 1.0)

    v = _df(2, routing="valiant")
    vloads = v.link_loads(traffic)
    vglob = _tier(v, vloads, "global")
    np.testing.assert_allclose(np.sort(np.unique(np.round(vglob, 12))), [0.0, 16 / 7])
    assert (np.isclose(vglob, 16 / 7)).sum() == 63
    assert vloads.max() == pytest.approx(16 / 7)
    assert loads.max() / vloads.max() == pytest.approx(3.5)

    u = _df(2, routing="ugal")
    np.testing.assert_allclose(u.link_loads(traffic), vloads)
    chosen = u.ugal_valiant_pairs(traffic.router_bytes)
    expect = np.zeros((9, 9), bool)
    expect[np.arange(9), (np.arange(9) + 1) % 9] = True
    np.testing.assert_array_equal(chosen, expect)
    np.testing.assert_array_equal(u.ugal_valiant, expect)
    # route follows the fixed choice; an explicit override still gives MIN.
    assert u.route(0, 8) == v.route(0, 8)
    assert u.route(0, 8, valiant=False) == t.route(0, 8)


def test_valiant_route_is_at_most_seven_links():
    t = _df(1, 3, 2, 7, routing="valiant")
    longest = max(max(_path_lengths(t, s, d)) for s in range(0, t.hosts, 2) for d in range(t.hosts) if s != d)
    assert longest == 7 > t.diameter()


def test_completion_time_uses_global_bandwidth():
    t = DragonFly(2, 100.0, 1e-6, global_bw_Bps=50.0, global_latency_s=2e-6)
    traffic = t.adversarial_traffic(1.0)
    # 8 bytes on a 50 B/s global link, plus the diameter (5) times the largest latency.
    assert t.completion_time_s(traffic) == pytest.approx(8 / 50 + 5 * 2e-6)


# -- bad input ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "field", "hint"), [
    ({"p": 2, "g": 10}, "fabric.g", "a*h+1 = 9"),
    ({"p": 1, "a": 3, "h": 2, "g": 8}, "fabric.g", "a*h+1 = 7"),
    ({"p": 1, "a": 2, "h": 1, "g": 1}, "fabric.g", ">= 2"),
    ({"p": 0}, "fabric.p", ">= 1"),
    ({"p": 1, "a": 0}, "fabric.a", ">= 1"),
    ({"p": 1, "h": 0}, "fabric.h", ">= 1"),
    ({"p": 1.5}, "fabric.p", ">= 1"),
    ({"p": 2, "routing": "adaptive"}, "fabric.routing", "'min', 'valiant', 'ugal'"),
    ({"p": 1, "a": 2, "h": 1, "g": 2, "routing": "valiant"}, "fabric.routing", "g >= 3"),
    ({"p": 2, "link_bw_Bps": 0.0}, "fabric.link_bw", "positive"),
    ({"p": 2, "global_bw_Bps": 0.0}, "fabric.global_bw", "positive"),
    ({"p": 2, "link_latency_s": -1.0}, "fabric.link_latency", ">= 0"),
])
def test_bad_input_names_the_field(kwargs, field, hint):
    args = {"link_bw_Bps": 1.0, "link_latency_s": 0.0} | kwargs
    with pytest.raises(UserError) as err:
        DragonFly(**args)
    message = str(err.value)
    assert message.startswith(field + ":") and hint in message and "\n" not in message


def test_route_checks_hosts_and_demand_shape():
    t = _df(1)
    with pytest.raises(UserError, match="route"):
        t.route(0, t.hosts)
    with pytest.raises(ValueError, match="6 x 6"):
        t.router_link_loads(np.zeros((5, 5)))
    with pytest.raises(UserError, match="g >= 3"):
        _df(1, 2, 1, 2).route(0, 3, valiant=True)


def test_the_latency_bound_follows_the_routing():
    # MIN: host, local, global, local, host. Valiant: one more global hop and up to two local ones.
    assert _df(2).max_route_links() == 5
    assert _df(2, routing="valiant").max_route_links() == 7
    assert _df(2, routing="ugal").longest_route_latency_s() == pytest.approx(7 * 1e-7)
    assert _df(2, a=1, h=3, g=4, routing="valiant").max_route_links() == 4
    # The bound holds for every Valiant route of a small instance.
    t = _df(1, routing="valiant")
    assert max(t.hops(s, d) for s in range(t.hosts) for d in range(t.hosts)) <= t.max_route_links()
