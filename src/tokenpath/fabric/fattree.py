"""Fat trees: the k-ary 3-level fat tree of Al-Fares et al. (SIGCOMM 2008) and the 2-tier leaf-spine
built from the same k-port switches, both routed with ECMP.

Both are folded Clos networks of one shape: a *router* (edge switch or leaf) has k/2 hosts below and k/2
uplinks above, into the k/2 aggregation switches of its pod. A leaf-spine is a single pod whose
"aggregation" switches are the spines and whose pod holds k leaves; the 3-level tree has k pods of k/2
edge switches and adds (k/2)^2 core switches, core (j, x) wired to aggregation switch j of every pod.
The code uses that shape for both: `_routers_per_pod` is k/2 (3 levels) or k (2 levels).

Node numbering (after the hosts 0..hosts-1): routers (edge/leaf) first, so router r is node hosts + r;
then the aggregation switches (pod p, position j: index p*k/2 + j; spines for 2 levels); then the cores
(j, x: index j*k/2 + x). Links, in `LinkTable` blocks so a link's index is arithmetic:

    host cables      host h <-> router h // (k/2)                up h, down hosts + h
    router-agg       router r <-> agg (pod(r), j)               up U + r*k/2 + j, down U + n1 + same
    agg-core         agg a = p*k/2 + j <-> core (j, x)          up C + a*k/2 + x, down C + n2 + same

ECMP splits every flow evenly over all shortest up/down paths, so the load on a link depends only on how
many bytes leave (or enter) the router or pod below it. `router_link_loads` uses exactly that: row and
column sums per router and per pod, no loop over switches.

Oversubscription: ratio r on a tier makes each of that tier's cables carry link_bw / r per direction
(port counts unchanged). The ratio is relative to the host link rate, not to the tier below: with
(2, 4) the edge switches are 2:1 and the cores see 4:1 from the hosts.
"""

from __future__ import annotations

import math

import numpy as np

from tokenpath.config.errors import UserError, quoted
from tokenpath.fabric.topology import (
    LinkTable,
    Topology,
    Traffic,
    check_latency,
    check_positive,
    check_whole,
)

LEVELS = (2, 3)


class FatTree(Topology):
    """A fat tree of k-port switches: 3 levels (k^3/4 hosts) or a 2-tier leaf-spine (k^2/2 hosts)."""

    kind = "fattree"
    direct = False
    scale_up = False
    single_hop = False

    def __init__(self, k: int, link_bw_Bps: float, link_latency_s: float, levels: int = 3,
                 oversubscription: tuple[float, ...] | None = None) -> None:
        check_whole(k, "fabric.k", 2, "the switch port count, e.g. 64")
        if k % 2:
            raise UserError(f"fabric.k: must be even (half of a switch's ports go down, half up), got {quoted(k)}; "
                            "e.g. 4, 48 or 64")
        if isinstance(levels, bool) or levels not in LEVELS:
            raise UserError(f"fabric.levels: must be 2 (leaf-spine) or 3 (fat tree), got {quoted(levels)}")
        check_positive(link_bw_Bps, "fabric.link_bw", "'400 Gb/s'")
        check_latency(link_latency_s, "fabric.link_latency")
        self.k, self.levels = int(k), int(levels)
        self.link_bw_Bps, self.link_latency_s = float(link_bw_Bps), float(link_latency_s)
        self.oversubscription = _check_ratios(oversubscription, self.levels)

        m = self._half = self.k // 2
        self.hosts = self.k * m * m if levels == 3 else self.k * m
        self.routers = self.hosts // m
        self._routers_per_pod = m if levels == 3 else self.k
        self.pods = self.routers // self._routers_per_pod       # k, or 1 for a leaf-spine
        self._aggs = self.pods * m                              # aggregation switches (or spines)
        cores = m * m if levels == 3 else 0
        self.switches = self.routers + self._aggs + cores
        self.host_router = np.arange(self.hosts, dtype=np.int64) // m
        self.tier_names = ("host", "edge-agg", "agg-core") if levels == 3 else ("host", "leaf-spine")

        h = self.hosts
        first_agg, first_core = h + self.routers, h + self.routers + self._aggs
        table = LinkTable()
        table.add_cables(np.arange(h), h + self.host_router, self.link_bw_Bps, self.link_latency_s, 0)
        # Router r, uplink j -> agg (pod(r), j): cable r*m + j.
        r = np.repeat(np.arange(self.routers), m)
        j = np.tile(np.arange(m), self.routers)
        self._agg_up = table.add_cables(h + r, first_agg + (r // self._routers_per_pod) * m + j,
                                        self.link_bw_Bps / self.oversubscription[0], self.link_latency_s, 1)
        self._agg_cables = len(r)
        if levels == 3:
            # Agg a = p*m + j, uplink x -> core (j, x): cable a*m + x.
            a = np.repeat(np.arange(self._aggs), m)
            x = np.tile(np.arange(m), self._aggs)
            self._core_up = table.add_cables(first_agg + a, first_core + (a % m) * m + x,
                                             self.link_bw_Bps / self.oversubscription[1], self.link_latency_s, 2)
            self._core_cables = len(a)
        self.links = table.build()

    # -- structure ------------------------------------------------------------------------------
    def diameter(self) -> int:
        # Hosts under different pods (3 levels) or leaves (2 levels) always exist since k >= 2.
        return 2 * self.levels

    def avg_hops(self) -> float:
        """Per source: k/2 - 1 hosts on its router (2 links), then its pod's other (k/2)^2 - k/2 hosts
        (4 links), then the rest in other pods (6 links); a leaf-spine stops at 4 links."""
        m, h = self._half, self.hosts
        same_router = m - 1
        if self.levels == 2:
            return (2 * same_router + 4 * (h - m)) / (h - 1)
        same_pod = m * m - m
        return (2 * same_router + 4 * same_pod + 6 * (h - m * m)) / (h - 1)

    def bisection_bw_Bps(self) -> float:
        """hosts/2 * link_bw / max(1, *oversubscription).

        Every tier carries one link per host below it: each router has k/2 hosts and k/2 uplinks, each
        pod (k/2)^2 hosts and (k/2)^2 core uplinks. So cutting the tier of ratio r between two equal
        halves (half the routers, or half the pods; k is even) crosses hosts/2 links of link_bw / r, and
        cutting the host cables crosses hosts/2 links of link_bw. No cut does better: a permutation in
        which each host of one half sends link_bw / max(r) to its own host of the other half loads no
        link beyond capacity under ECMP (each uplink carries 1/(k/2) or 1/(k/2)^2 of the hosts below),
        so that much flow crosses any equal cut."""
        return self.hosts / 2 * self.link_bw_Bps / max(1.0, *self.oversubscription)

    # -- routing --------------------------------------------------------------------------------
    def route(self, src: int, dst: int) -> dict[int, float]:
        """ECMP: up through each of the pod's k/2 aggregation switches with 1/(k/2); between pods, on
        through each of the k/2 cores above that agg, so 1/(k/2)^2 per agg-core link."""
        self.check_hosts(np.array([src, dst]), "route")
        src, dst = int(src), int(dst)
        if src == dst:
            return {}
        m, h = self._half, self.hosts
        rs, rd = src // m, dst // m
        route = {src: 1.0, h + dst: 1.0}
        if rs == rd:
            return route
        up, down = self._agg_up, self._agg_up + self._agg_cables
        for j in range(m):
            route[up + rs * m + j] = 1.0 / m
            route[down + rd * m + j] = 1.0 / m
        ps, pd = rs // self._routers_per_pod, rd // self._routers_per_pod
        if ps == pd:
            return route
        up, down = self._core_up, self._core_up + self._core_cables
        for j in range(m):
            for x in range(m):
                # agg (ps, j) -> core (j, x) -> agg (pd, j): the core ties agg j of every pod.
                route[up + (ps * m + j) * m + x] = 1.0 / (m * m)
                route[down + (pd * m + j) * m + x] = 1.0 / (m * m)
        return route

    def router_link_loads(self, router_bytes: np.ndarray) -> np.ndarray:
        """Each router uplink carries 1/(k/2) of what leaves the router; each agg-core uplink 1/(k/2)^2
        of what leaves the pod (downlinks likewise with what enters)."""
        demand = self.demand(router_bytes)
        m = self._half
        loads = np.zeros(len(self.links))
        local = np.diagonal(demand)
        leaving = demand.sum(axis=1) - local
        entering = demand.sum(axis=0) - local
        up, n = self._agg_up, self._agg_cables
        loads[up: up + n] = np.repeat(leaving / m, m)
        loads[up + n: up + 2 * n] = np.repeat(entering / m, m)
        if self.levels == 3:
            p, rp = self.pods, self._routers_per_pod
            pod = demand.reshape(p, rp, p, rp).sum(axis=(1, 3))
            local = np.diagonal(pod)
            up, n = self._core_up, self._core_cables
            loads[up: up + n] = np.repeat((pod.sum(axis=1) - local) / (m * m), m * m)
            loads[up + n: up + 2 * n] = np.repeat((pod.sum(axis=0) - local) / (m * m), m * m)
        return loads

    # -- named patterns -------------------------------------------------------------------------
    def adversarial_traffic(self, bytes_per_host: float) -> Traffic:
        """Host h sends to the host at the same position one pod on (3 levels: h + (k/2)^2) or one leaf
        on (2 levels: h + k/2), wrapping round. Every byte then climbs to the top tier, and every top-tier
        uplink and downlink carries exactly `bytes_per_host`: the permutation that makes the bisection
        (and any top-tier oversubscription) the bottleneck."""
        src = np.arange(self.hosts)
        step = self._half * self._half if self.levels == 3 else self._half
        return Traffic.from_flows(self, src, (src + step) % self.hosts, bytes_per_host)


def _check_ratios(ratios: tuple[float, ...] | None, levels: int) -> tuple[float, ...]:
    """One ratio >= 1 per switch tier; None means non-blocking."""
    tiers = levels - 1
    if ratios is None:
        return (1.0,) * tiers
    if isinstance(ratios, (str, bytes)) or not hasattr(ratios, "__len__") or len(ratios) != tiers:
        names = "edge-agg, agg-core" if levels == 3 else "leaf-spine"
        raise UserError(f"fabric.oversubscription: needs {tiers} ratio{'s' if tiers > 1 else ''} for {levels} "
                        f"levels ({names}), got {quoted(ratios)}; e.g. {(1.0,) * tiers!r}")
    out = []
    for value in ratios:
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        if not ok or not 1 <= value < math.inf:
            raise UserError(f"fabric.oversubscription: each ratio must be a number >= 1 (1 = non-blocking), "
                            f"got {quoted(value)}")
        out.append(float(value))
    return tuple(out)
