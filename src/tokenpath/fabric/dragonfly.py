"""DragonFly (Kim, Dally, Scott, Abts, ISCA 2008): groups of routers wired all-to-all inside, groups
wired to each other by global links, routed MIN, Valiant or UGAL.

Shape: p hosts per router, a routers per group, h global ports per router, g groups. The balanced
default is a = 2p, h = p and the largest g = a*h + 1, where exactly one global link joins every pair
of groups. Router index = group*a + position; host h hangs off router h // p; router r is node
hosts + r.

Links, in `LinkTable` blocks so a link's index is arithmetic (tiers "host", "local", "global"):

    host cables     host h <-> router h // p                 up h, down hosts + h
    local cables    group i, positions x < y                 x->y  L0 + i*a(a-1)/2 + k(x, y)
                                                             y->x  L0 + g*a(a-1)/2 + (same)
    global cables   one per owning port (see below)          `global_links` / `_out_link`

Global wiring: the "relative" arrangement (Hastings et al., "Comparing global link arrangements for
Dragonfly networks", IEEE Cluster 2015). Group i numbers its a*h global ports in router order (port j
on router j // h) and port j points at group i + offset(j) mod g, with offset(j) = j mod (g-1) + 1 for
the first m*(g-1) ports, m = (a*h) // (g-1): every offset, so every other group, gets m ports, spread
over the routers. The t-th port of offset d in group i is cabled to the t-th port of offset g-d in
group i+d, so each cable's two ends agree. With g = a*h + 1 (m = 1) this is the classic arrangement:
router x of group i reaches groups i+x*h+1 .. i+x*h+h and lands on router a-1-x there. The r = a*h -
m*(g-1) ports left over (only when g < a*h+1) get offsets in matched pairs 1, g-1, 2, g-2, ... so
those nearby groups get m+1 parallel links; if r is odd the last port takes offset g/2 (g even, its
own match) or stays unused (g odd): at most one unused port per group. Because a port's offset does
not depend on its group, every group looks the same (the wiring is circulant), which is what lets
`router_link_loads` work per port over all groups at once.

Routing, for hosts on different routers (traffic inside a group takes its one local link under every
routing; traffic inside a router touches only host links):

* "min": local hop to the router holding a global link to the destination group, that link, local hop
  to the destination router; a local hop is skipped when not needed. With m > 1 parallel links between
  the two groups the bytes split evenly over all of them (ECMP), so routes of one pair can differ in
  length by the skipped local hops.
* "valiant": via an intermediate group chosen uniformly among the g-2 groups other than source and
  destination (expected loads: each carries 1/(g-2)); leg 1 is MIN from the source router to the
  intermediate group (it ends on the router the global link lands on), leg 2 MIN from there. Needs
  g >= 3.
* "ugal": per (source group, destination group), MIN or Valiant by load; a deterministic stand-in for
  UGAL-G (see `ugal_valiant_pairs`). `route` needs the choice, which depends on the demand: it uses the
  choice fixed by the last `router_link_loads` (or `link_loads`) call, MIN for every pair before any.

`diameter` and `avg_hops` describe MIN routes (the shortest the routing ever takes); with parallel
links `avg_hops` weighs each of a pair's routes by the fraction it carries (equal to
sum(route(s, d).values())). A Valiant route is up to 7 links (host, local, global, local, global,
local, host).
"""

from __future__ import annotations

import numpy as np

from tokenpath.config.assumptions import assumed, default
from tokenpath.config.errors import UserError, quoted
from tokenpath.fabric.topology import (
    LinkTable,
    Topology,
    Traffic,
    check_latency,
    check_positive,
    check_whole,
)

ROUTINGS = ("min", "valiant", "ugal")
# UGAL stand-in: a pair goes Valiant when its MIN links would carry more than this many times the mean
# global-link load of all-Valiant routing (a Valiant path crosses two global links, a MIN path one).
UGAL_HOP_RATIO = default("ugal_hop_ratio")


class DragonFly(Topology):
    """g groups of a routers (all-to-all inside), h global links per router, p hosts per router.

    `ugal_valiant` (g x g bool) is UGAL's choice in force, True where a (source group, destination
    group) pair goes Valiant; `router_link_loads` sets it under "ugal" and `route` follows it."""

    kind = "dragonfly"
    direct = False
    scale_up = False
    single_hop = False
    tier_names = ("host", "local", "global")

    def __init__(self, p: int, link_bw_Bps: float, link_latency_s: float, a: int | None = None,
                 h: int | None = None, g: int | None = None, routing: str = "min",
                 global_bw_Bps: float | None = None, global_latency_s: float | None = None) -> None:
        check_whole(p, "fabric.p", 1, "hosts per router, e.g. 4")
        self.ugal_hop_ratio = assumed("ugal_hop_ratio", UGAL_HOP_RATIO)  # read once: the run's value
        a = 2 * p if a is None else a
        check_whole(a, "fabric.a", 1, "routers per group, e.g. 2*p")
        h = p if h is None else h
        check_whole(h, "fabric.h", 1, "global links per router, e.g. p")
        most = a * h + 1
        g = most if g is None else g
        check_whole(g, "fabric.g", 2, f"number of groups, at most a*h+1 = {most}")
        if g > most:
            raise UserError(f"fabric.g: must be <= a*h+1 = {most} (each group has a*h = {a * h} global ports, "
                            f"one per other group at least), got {quoted(g)}")
        if routing not in ROUTINGS:
            raise UserError(f"fabric.routing: must be one of {', '.join(map(repr, ROUTINGS))}, got {routing!r}")
        if routing != "min" and g < 3:
            raise UserError(f"fabric.routing: {routing!r} needs g >= 3 groups (an intermediate group other than "
                            f"source and destination), got g = {g}; use 'min'")
        check_positive(link_bw_Bps, "fabric.link_bw", "'200 Gb/s'")
        check_latency(link_latency_s, "fabric.link_latency", "'100 ns'")
        global_bw_Bps = link_bw_Bps if global_bw_Bps is None else global_bw_Bps
        check_positive(global_bw_Bps, "fabric.global_bw", "'200 Gb/s'")
        global_latency_s = link_latency_s if global_latency_s is None else global_latency_s
        check_latency(global_latency_s, "fabric.global_latency")

        self.p, self.a, self.h, self.g = int(p), int(a), int(h), int(g)
        self.routing = routing
        self.link_bw_Bps, self.link_latency_s = float(link_bw_Bps), float(link_latency_s)
        self.global_bw_Bps, self.global_latency_s = float(global_bw_Bps), float(global_latency_s)
        p, a, h, g = self.p, self.a, self.h, self.g
        self.routers = self.switches = a * g
        self.hosts = p * self.routers
        self.host_router = np.arange(self.hosts, dtype=np.int64) // p
        self._wire_ports()

        n = self.hosts
        table = LinkTable()
        table.add_cables(np.arange(n), n + self.host_router, self.link_bw_Bps, self.link_latency_s, 0)
        # Local cables, group-major, pairs x < y in np.triu_indices order.
        self._pairs = a * (a - 1) // 2
        x, y = np.triu_indices(a, k=1)
        base = np.repeat(np.arange(g) * a, self._pairs)
        self._local0 = table.add_cables(n + base + np.tile(x, g), n + base + np.tile(y, g),
                                        self.link_bw_Bps, self.link_latency_s, 1)
        k = np.full((a, a), -1, np.int64)
        k[x, y] = np.arange(self._pairs)
        k[y, x] = g * self._pairs + np.arange(self._pairs)
        self._local_off = k                      # local link x->y of group i: _local0 + i*pairs + k[x, y]
        # Global cables: one per owning port (offset d < g-d, or d = g/2 from the lower group).
        gi = np.arange(g)[:, None]
        d = self._port_offset[None, :]
        owner = (d > 0) & ((2 * d < g) | ((2 * d == g) & (gi < g // 2)))
        oi, oj = np.nonzero(owner)
        peer_group = (oi + self._port_offset[oj]) % g
        peer_port = self._port_peer[oj]
        self._global0 = table.add_cables(n + oi * a + oj // h, n + peer_group * a + peer_port // h,
                                         self.global_bw_Bps, self.global_latency_s, 2)
        cables = len(oi)
        out = np.full((g, a * h), -1, np.int64)  # out[i, j]: the link leaving group i by port j
        out[oi, oj] = self._global0 + np.arange(cables)
        out[peer_group, peer_port] = self._global0 + cables + np.arange(cables)
        self._out_link = out
        self.links = table.build()
        self.ugal_valiant = np.zeros((g, g), bool)

    def _wire_ports(self) -> None:
        """Each port's offset (0: unused) and its peer port; see the module docstring."""
        a, h, g = self.a, self.h, self.g
        ports = a * h
        m = ports // (g - 1)
        offset = np.zeros(ports, np.int64)
        offset[: m * (g - 1)] = np.arange(m * (g - 1)) % (g - 1) + 1
        spare = ports - m * (g - 1)
        extra = []
        for s in range(spare // 2):
            extra += [s + 1, g - 1 - s]
        if spare % 2 and g % 2 == 0:
            extra.append(g // 2)
        offset[m * (g - 1): m * (g - 1) + len(extra)] = extra
        count = np.bincount(offset, minlength=g)
        count[0] = 0
        by_offset = np.full((g, max(1, int(count.max()))), -1, np.int64)  # by_offset[d]: ports of offset d
        rank = np.zeros(ports, np.int64)                                   # t: the how-manyth of its offset
        for dd in range(1, g):
            mine = np.flatnonzero(offset == dd)
            by_offset[dd, : len(mine)] = mine
            rank[mine] = np.arange(len(mine))
        used = offset > 0
        peer = np.full(ports, -1, np.int64)
        peer[used] = by_offset[g - offset[used], rank[used]]
        self._port_offset, self._port_peer, self._by_offset = offset, peer, by_offset
        self._links_per_offset = count                         # m_d, the links between i and i+d
        self._port_share = np.where(used, 1.0 / np.maximum(count[offset], 1), 0.0)

    # -- structure ------------------------------------------------------------------------------
    def global_links(self, src_group: np.ndarray | int, dst_group: np.ndarray | int) -> np.ndarray:
        """Global links from `src_group` to `dst_group` (broadcast), as an array of shape (..., m_max)
        padded with -1; a pair with m parallel links lists m of them (none for a group to itself)."""
        i = np.asarray(src_group, np.int64)
        k = np.asarray(dst_group, np.int64)
        ports = self._by_offset[(k - i) % self.g]             # (..., m_max), -1 padded
        i_full = np.broadcast_to(i, np.broadcast_shapes(i.shape, k.shape))[..., None]
        return np.where(ports >= 0, self._out_link[i_full, np.maximum(ports, 0)], -1)

    def links_between(self, src_group: int, dst_group: int) -> int:
        """How many parallel global links join the two groups (0 for a group with itself)."""
        return 0 if src_group == dst_group else int(self._links_per_offset[(dst_group - src_group) % self.g])

    def diameter(self) -> int:
        """MIN routes: host, local, global, local, host (5); with a = 1 there are no local hops (3)."""
        return 5 if self.a > 1 else 3

    def max_route_links(self) -> int:
        """Valiant (and UGAL's Valiant pairs) add a global hop and up to two local ones: host, local,
        global, local, global, local, host (7); with a = 1, host, global, global, host (4)."""
        if self.routing == "min":
            return self.diameter()
        return 7 if self.a > 1 else 4

    def avg_hops(self) -> float:
        """Per source host: p-1 hosts on its router (2 links), p(a-1) elsewhere in its group (3), and
        pa(g-1) in other groups: 3 links plus each local hop, needed unless the global link used starts
        (ends) on the source (destination) router, which for a random router of the group happens with
        probability 1/a whatever the wiring. Parallel links are weighed by the share they carry."""
        p, a, g = self.p, self.a, self.g
        other_groups = p * a * (g - 1) * (3 + 2 * (a - 1) / a)
        return (2 * (p - 1) + 3 * p * (a - 1) + other_groups) / (self.hosts - 1)

    def bisection_bw_Bps(self) -> float:
        """Global capacity, one direction, from groups 0..g//2-1 to the others (g odd: g//2 vs g//2+1
        groups). When every pair of groups has the same number m of links (always when g-1 divides a*h,
        e.g. the balanced largest size, m = 1) every split of whole groups crosses
        floor(g/2)*ceil(g/2)*m links, so this is the bisection over group splits. Otherwise pairs have m
        or m+1 links and this contiguous split is counted exactly, link by link, in O(links); another
        split of the groups may cross a few links fewer. Half the hosts' own links cap it."""
        src = self.links.src - self.hosts
        dst = self.links.dst - self.hosts
        first = self._global0
        half = self.g // 2
        s_group, d_group = src[first:] // self.a, dst[first:] // self.a
        crossing = (s_group < half) & (d_group >= half)
        return min(float(self.links.bw_Bps[first:][crossing].sum()), self.hosts // 2 * self.link_bw_Bps)

    # -- routing --------------------------------------------------------------------------------
    def _local_link(self, group: int, x: int, y: int) -> int:
        return int(self._local0 + group * self._pairs + self._local_off[x, y])

    def _ends(self, link: int) -> tuple[int, int]:
        """Routers at the two ends of a link."""
        return int(self.links.src[link]) - self.hosts, int(self.links.dst[link]) - self.hosts

    def _add(self, route: dict[int, float], link: int, share: float) -> None:
        route[link] = route.get(link, 0.0) + share

    def _to_group(self, route: dict[int, float], r: int, k: int, share: float) -> list[tuple[int, float]]:
        """MIN from router r to group k: local hop if needed, then each parallel link with an equal
        part. Returns the landing routers with their shares."""
        a = self.a
        i = r // a
        links = [int(x) for x in self.global_links(i, k) if x >= 0]
        landed = []
        for link in links:
            u, v = self._ends(link)
            part = share / len(links)
            if u != r:
                self._add(route, self._local_link(i, r % a, u % a), part)
            self._add(route, link, part)
            landed.append((v, part))
        return landed

    def _min(self, route: dict[int, float], r: int, q: int, share: float) -> None:
        """MIN from router r to router q (r != q)."""
        a = self.a
        if r // a == q // a:
            self._add(route, self._local_link(r // a, r % a, q % a), share)
            return
        for v, part in self._to_group(route, r, q // a, share):
            if v != q:
                self._add(route, self._local_link(q // a, v % a, q % a), part)

    def route(self, src: int, dst: int, valiant: bool | None = None) -> dict[int, float]:
        """The reference, one pair at a time. `valiant` overrides the routing's choice for this pair
        (for "ugal" the default is the choice of the last `router_link_loads` call)."""
        self.check_hosts(np.array([src, dst]), "route")
        src, dst = int(src), int(dst)
        if src == dst:
            return {}
        route = {src: 1.0, self.hosts + dst: 1.0}
        r, q = int(self.host_router[src]), int(self.host_router[dst])
        if r == q:
            return route
        i, k = r // self.a, q // self.a
        if valiant is None:
            valiant = self.routing == "valiant" or (self.routing == "ugal" and bool(self.ugal_valiant[i, k]))
        if i == k or not valiant:
            self._min(route, r, q, 1.0)
            return route
        if self.g < 3:
            raise UserError("route: Valiant needs g >= 3 groups (an intermediate group), this dragonfly has 2")
        share = 1.0 / (self.g - 2)
        for j in range(self.g):
            if j != i and j != k:
                for v, part in self._to_group(route, r, j, share):
                    self._min(route, v, q, part)
        return route

    def _aggregate(self, demand: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Inside-group blocks (g, a, a), router->group demand (g, a, g) and group->router demand
        (g, g, a), the last two with a group's traffic to itself zeroed. One pass over the R x R demand, a
        group's rows at a time (they stay in cache for the second sum), and no R x R temporary."""
        a, g, r = self.a, self.g, self.routers
        ar = np.arange(g)
        inside = demand.reshape(g, a, g, a)[ar, :, ar, :]
        to_group = np.empty((g, a, g))
        from_group = np.empty((g, g, a))
        ones = np.ones(a)
        for i in range(g):
            rows = demand[i * a: (i + 1) * a]
            np.matmul(rows.reshape(a * g, a), ones, out=to_group[i].reshape(a * g))
            np.matmul(ones, rows, out=from_group[i].reshape(r))
        to_group[ar, :, ar] = 0.0
        from_group[ar, ar, :] = 0.0
        return inside, to_group, from_group

    def _gateways(self) -> np.ndarray:
        """(g, g, a): share[i, k, u] of the bytes from group i to group k that cross on a global link
        leaving router u of group i; also share[k, i, v] of them that land on router v of group k (the
        link i -> k is the cable of a port of k pointing at i). Circulant: only the offset k - i matters."""
        a, h, g = self.a, self.h, self.g
        used = self._port_share > 0
        by_router = np.zeros((g, a))                                          # [offset, router]
        np.add.at(by_router, (self._port_offset[used], np.flatnonzero(used) // h), self._port_share[used])
        ar = np.arange(g)
        return by_router[(ar[None, :] - ar[:, None]) % g]

    def _min_loads(self, loads: np.ndarray, local: np.ndarray, gateways: np.ndarray, to_group: np.ndarray,
                   from_group: np.ndarray | None) -> None:
        """Add MIN routing of inter-group demand: `to_group` (g, a, g) router->group bytes for the first
        local hop and (summed) the global links, `from_group` (g, g, a) group->router bytes for the last
        local hop (None: the route ends where the global link lands, Valiant's first leg). `local`
        (g, a, a) gathers local loads by (group, from, to); its diagonal is not a link and is ignored."""
        g = self.g
        ar = np.arange(g)
        # First hop: router x of group i sends gateways[i, k, u] of its bytes to group k via router u.
        local += np.matmul(to_group, gateways)
        # Global: port j of group i carries share(j) of what group i sends to group i + offset(j).
        group = to_group.sum(axis=1)
        used = self._port_share > 0
        toward = (ar[:, None] + self._port_offset[None, used]) % g
        loads[self._out_link[:, used]] += group[ar[:, None], toward] * self._port_share[used]
        if from_group is not None:
            # Last hop: gateways[k, i, v] of group i's bytes to group k land on router v of k.
            local += np.matmul(gateways.transpose(0, 2, 1), from_group.transpose(1, 0, 2))

    def _valiant_loads(self, loads: np.ndarray, local: np.ndarray, gateways: np.ndarray,
                       to_group: np.ndarray, from_group: np.ndarray) -> None:
        """Add Valiant routing of inter-group demand: two MIN legs, each intermediate group 1/(g-2)."""
        a, g = self.a, self.g
        ar = np.arange(g)
        spread = 1.0 / (g - 2)
        # Leg 1: router -> intermediate group j gets what it sends to groups other than its own and j.
        leg1 = (to_group.sum(axis=2, keepdims=True) - to_group) * spread
        leg1[ar, :, ar] = 0.0
        self._min_loads(loads, local, gateways, leg1, None)
        # Leg 2: of group i's bytes to group k (k not i, j), 1/(g-2) crosses j, landing on router v of j
        # with share gateways[j, i, v]; from there they go MIN to k.
        group = to_group.sum(axis=1)                                          # (g, g), zero diagonal
        landed = gateways.transpose(0, 2, 1).reshape(g * a, g)                # [(j, v), i]
        leg2 = (landed @ group).reshape(g, a, g) * spread
        leg2[ar, :, ar] = 0.0
        into = from_group.sum(axis=0)                                         # (g, a): bytes into each router
        leg2_from = (into[None, :, :] - from_group) * spread
        leg2_from[ar, ar, :] = 0.0
        self._min_loads(loads, local, gateways, leg2, leg2_from)

    def ugal_valiant_pairs(self, router_bytes: np.ndarray) -> np.ndarray:
        """UGAL's choice per (source group, destination group), True = Valiant: the deterministic stand-in
        for UGAL-G. Under all-MIN a pair's m links carry only its own bytes, G[i, k]/m each; under
        all-Valiant every inter-group byte crosses two global links, so their mean load is 2*S/n (S the
        inter-group bytes, n the directed global links). UGAL-G sends a packet MIN unless the MIN queue
        times the MIN hops beats the Valiant queue times the Valiant hops; with queues read as these
        loads and 2 global hops against 1, a pair goes Valiant when G[i, k]/m > 2 * (2*S/n). Uniform
        traffic therefore stays MIN and a pair that would swamp its own links goes Valiant."""
        demand = self.demand(router_bytes)
        _, to_group, _ = self._aggregate(demand)
        return self._ugal_choice(to_group.sum(axis=1))

    def _ugal_choice(self, group: np.ndarray) -> np.ndarray:
        g = self.g
        ar = np.arange(g)
        m = self._links_per_offset[(ar[None, :] - ar[:, None]) % g].astype(np.float64)
        n_global = len(self.links) - self._global0
        valiant_mean = 2.0 * group.sum() / n_global
        with np.errstate(invalid="ignore", divide="ignore"):
            per_link = np.where(m > 0, group / np.maximum(m, 1), 0.0)
        return per_link > self.ugal_hop_ratio * valiant_mean

    def router_link_loads(self, router_bytes: np.ndarray) -> np.ndarray:
        """Loads from the router->group, group->router and group->group sums (no loop over router pairs,
        no R x R temporary); traffic inside a group loads its local link directly. For "ugal" this also
        fixes the per-pair choice that `route` then follows."""
        demand = self.demand(router_bytes)
        a, g = self.a, self.g
        loads = np.zeros(len(self.links))
        inside, to_group, from_group = self._aggregate(demand)
        local = inside.copy()
        gateways = self._gateways()
        if self.routing == "min":
            self._min_loads(loads, local, gateways, to_group, from_group)
        elif self.routing == "valiant":
            self._valiant_loads(loads, local, gateways, to_group, from_group)
        else:
            valiant = self._ugal_choice(to_group.sum(axis=1))
            self.ugal_valiant = valiant
            keep = ~valiant
            self._min_loads(loads, local, gateways, to_group * keep[:, None, :], from_group * keep[:, :, None])
            self._valiant_loads(loads, local, gateways, to_group * valiant[:, None, :],
                                from_group * valiant[:, :, None])
        off = ~np.eye(a, dtype=bool)
        index = self._local0 + np.arange(g)[:, None] * self._pairs + self._local_off[off][None, :]
        loads[index] = local[:, off]
        return loads

    # -- named patterns -------------------------------------------------------------------------
    def adversarial_traffic(self, bytes_per_host: float) -> Traffic:
        """Every host of group i sends to the host at the same position in group i+1: under MIN each
        group's p*a hosts share the m links to the next group (one link at the largest size)."""
        src = np.arange(self.hosts)
        return Traffic.from_flows(self, src, (src + self.p * self.a) % self.hosts, bytes_per_host)
