"""What every topology shares: nodes, directed links, traffic folded to routers, and link loads.

Node numbering: hosts (the chips) are nodes 0..hosts-1. In an indirect network (fat tree, dragonfly,
switched domain) switches follow as nodes hosts..hosts+switches-1, and every host hangs off one
*router* (its edge switch); in a direct network (torus, mesh, full mesh) the chips are the routers.

Traffic is folded to routers before routing (`Traffic.router_bytes`, R x R), so the cost of computing
link loads grows with the number of routers, not with the square of the host count. Each topology routes
with its own explicit rule (ECMP, dimension order, MIN/Valiant/UGAL): generic shortest paths pick the
wrong routes on a torus or a DragonFly. A topology implements the rule twice on purpose: `route` for one
pair of hosts, spelled out (the reference, also used to show a route), and `router_link_loads`,
vectorized over the whole demand; tests check the two agree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from tokenpath.config.errors import UserError, quoted
from tokenpath.fabric.spec import NVLS_TUNER_EFFICIENCY


@dataclass(frozen=True)
class Links:
    """Directed links. A cable is two links, at indices i and i + n of the block it was added in."""

    src: np.ndarray         # int64 node ids
    dst: np.ndarray         # int64 node ids
    bw_Bps: np.ndarray      # float64, per direction
    latency_s: np.ndarray   # float64, per hop
    tier: np.ndarray        # int8 index into Topology.tier_names

    def __len__(self) -> int:
        return len(self.src)


class LinkTable:
    """Builds `Links` block by block, so each topology can find a link's index by arithmetic."""

    def __init__(self) -> None:
        self._blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.size = 0

    def add_cables(self, a: np.ndarray, b: np.ndarray, bw_Bps: float | np.ndarray, latency_s: float,
                   tier: int) -> int:
        """Add cables a[i] <-> b[i]; returns `start`: a->b links are start + i, b->a are start + n + i."""
        a = np.asarray(a, np.int64)
        b = np.asarray(b, np.int64)
        n = len(a)
        bw = np.broadcast_to(np.asarray(bw_Bps, np.float64), (n,))
        start = self.size
        self._blocks.append((np.concatenate([a, b]), np.concatenate([b, a]), np.concatenate([bw, bw]),
                             np.full(2 * n, latency_s), np.full(2 * n, tier, np.int8)))
        self.size += 2 * n
        return start

    def build(self) -> Links:
        if not self._blocks:
            empty = np.empty(0, np.int64)
            return Links(empty, empty, np.empty(0), np.empty(0), np.empty(0, np.int8))
        cols = list(zip(*self._blocks))
        return Links(*(np.concatenate(c) for c in cols))


@dataclass(frozen=True)
class Traffic:
    """Bytes to move between hosts, folded to the routers they attach to.

    `router_bytes[i, j]` is the sum over host pairs (s on router i, d on router j, s != d) of the bytes
    s sends d; the diagonal holds traffic that turns around inside one router. `host_out_bytes` and
    `host_in_bytes` are each host's totals, which load its own link in an indirect network.
    """

    router_bytes: np.ndarray
    host_out_bytes: np.ndarray
    host_in_bytes: np.ndarray

    @staticmethod
    def from_flows(topology: Topology, src: np.ndarray, dst: np.ndarray, size_bytes: np.ndarray | float) -> Traffic:
        """Traffic of explicit host-to-host flows (flows from a host to itself move nothing)."""
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        topology.check_hosts(src, "traffic")
        topology.check_hosts(dst, "traffic")
        size = np.broadcast_to(np.asarray(size_bytes, np.float64), src.shape)
        moving = src != dst
        src, dst, size = src[moving], dst[moving], size[moving]
        r = topology.routers
        router = topology.host_router
        pairs = router[src] * r + router[dst]
        folded = np.bincount(pairs, weights=size, minlength=r * r).reshape(r, r)
        h = topology.hosts
        return Traffic(folded, np.bincount(src, weights=size, minlength=h), np.bincount(dst, weights=size, minlength=h))

    @staticmethod
    def all_to_all(topology: Topology, bytes_per_pair: float, hosts: np.ndarray | None = None) -> Traffic:
        """Every host of `hosts` (default: all) sends `bytes_per_pair` to every other one."""
        members = np.arange(topology.hosts) if hosts is None else np.asarray(hosts, np.int64)
        topology.check_hosts(members, "traffic")
        if len(np.unique(members)) != len(members):
            raise ValueError("all_to_all: a host is listed twice")
        per_router = np.bincount(topology.host_router[members], minlength=topology.routers).astype(np.float64)
        folded = np.multiply.outer(per_router, per_router)
        folded[np.diag_indices_from(folded)] -= per_router  # no host sends to itself
        folded *= bytes_per_pair
        each = np.zeros(topology.hosts)
        each[members] = bytes_per_pair * (len(members) - 1)
        return Traffic(folded, each, each.copy())


class Topology(ABC):
    """A network of `hosts` chips. Subclasses set the attributes below (in their constructor or as
    class attributes).

    The traits at the end say what kind of network it is, so that collectives read them instead of
    the kind's name: a new topology sets them and nothing outside its module, its table (spec.py) and
    the builder (build.py) changes.
    """

    kind: str                 # its table's kind, for people (messages, reports)
    hosts: int
    switches: int
    routers: int
    host_router: np.ndarray   # router index of each host
    links: Links
    tier_names: tuple[str, ...]
    # -- traits ---------------------------------------------------------------------------------
    direct: bool              # chips are the routers (no host links); else switched
    scale_up: bool            # NVLink-class links (a scale-up domain), else NIC-class (scale-out)
    single_hop: bool          # every chip reaches every other over one switch or one cable
    nvls: bool = False        # its switch reduces in the network (NVLink SHARP)
    nvls_efficiency: float = NVLS_TUNER_EFFICIENCY["Hopper"]  # NCCL's rating of that reduction
    generation: str = ""      # its chips' (catalog/chips.toml), by which the runtime's tuner rates them (tuner.py)
    dims: tuple[int, ...] = ()  # chips on a box of these sizes, linked along each dimension (tori, meshes)
    rings: tuple[bool, ...] = ()  # per dimension of `dims`: it wraps round (a ring), else a line

    # -- structure ------------------------------------------------------------------------------
    @property
    def cables(self) -> int:
        """Bidirectional links, host links included."""
        return len(self.links) // 2

    def scale_up_links(self) -> np.ndarray:
        """Which links are NVLink-class (bool per link): all or none, as the topology is a scale-up
        domain or not (a hierarchy mixes the two)."""
        return np.full(len(self.links), self.scale_up)

    @abstractmethod
    def diameter(self) -> int:
        """Most links on the route between two distinct hosts."""

    @abstractmethod
    def avg_hops(self) -> float:
        """Mean links on the route over ordered pairs of distinct hosts."""

    @abstractmethod
    def bisection_bw_Bps(self) -> float:
        """Capacity, one direction, across a cut of the hosts into two equal halves: the narrowest
        one for a fat tree, torus or mesh; each topology documents the cut it takes."""

    # -- routing --------------------------------------------------------------------------------
    @abstractmethod
    def route(self, src: int, dst: int) -> dict[int, float]:
        """Links the traffic from host `src` to host `dst` crosses, each with the fraction it carries."""

    @abstractmethod
    def router_link_loads(self, router_bytes: np.ndarray) -> np.ndarray:
        """Bytes on every directed link from router-level demand (host links left at zero)."""

    def demand(self, router_bytes: np.ndarray) -> np.ndarray:
        """`router_bytes` as a float64 routers x routers array, checked (for `router_link_loads`)."""
        demand = np.ascontiguousarray(router_bytes, np.float64)
        if demand.shape != (self.routers, self.routers):
            raise ValueError(f"router_bytes must be {self.routers} x {self.routers}, got {demand.shape}")
        return demand

    def host_links(self, host: int) -> tuple[int, int]:
        """Indices of the host's (up, down) links; indirect networks add these first, as one block."""
        return host, self.hosts + host

    def link_loads(self, traffic: Traffic) -> np.ndarray:
        """Bytes on every directed link."""
        loads = self.router_link_loads(traffic.router_bytes)
        if not self.direct:
            loads[: self.hosts] += traffic.host_out_bytes
            loads[self.hosts: 2 * self.hosts] += traffic.host_in_bytes
        return loads

    def hops(self, src: int, dst: int) -> float:
        """Links on the route from `src` to `dst`, averaged over the paths traffic is split across."""
        return float(sum(self.route(src, dst).values()))

    def completion_time_s(self, traffic: Traffic, bw_efficiency: float = 1.0) -> float:
        """Time to deliver `traffic` if the busiest link sets the pace: its bytes over its capacity,
        plus the latency of the longest route."""
        loads = self.link_loads(traffic)
        busy = loads / (self.links.bw_Bps * bw_efficiency)
        return float(busy.max(initial=0.0)) + self.longest_route_latency_s()

    def longest_route_latency_s(self) -> float:
        """Latency of the longest route the routing takes, at the slowest link's latency (an estimate
        for the latency term of a round whose flows are too many to route one by one)."""
        return self.max_route_links() * float(self.links.latency_s.max(initial=0.0))

    def max_route_links(self) -> int:
        """Most links on any route the topology's routing takes (the diameter, for minimal routing)."""
        return self.diameter()

    # -- named patterns -------------------------------------------------------------------------
    def tornado_traffic(self, bytes_per_host: float) -> Traffic:
        """Each host sends to the host half-way round the host numbering (torus overrides this with the
        per-dimension tornado)."""
        src = np.arange(self.hosts)
        return Traffic.from_flows(self, src, (src + self.hosts // 2) % self.hosts, bytes_per_host)

    def adversarial_traffic(self, bytes_per_host: float) -> Traffic:
        """A permutation that loads this topology's routing worst; subclasses define theirs."""
        return self.tornado_traffic(bytes_per_host)

    # -- checks ---------------------------------------------------------------------------------
    def check_hosts(self, hosts: np.ndarray, what: str) -> None:
        outside = np.asarray(hosts)[(np.asarray(hosts) < 0) | (np.asarray(hosts) >= self.hosts)]
        if len(outside):
            raise UserError(f"{what}: host {int(outside[0])} is outside this {self.hosts}-host {self.kind}; "
                            f"use hosts 0..{self.hosts - 1}")

    def graph(self):
        """The topology as an undirected rustworkx graph (nodes: hosts then switches; one edge per cable)."""
        import rustworkx as rx

        g = rx.PyGraph()
        g.add_nodes_from(range(self.hosts + self.switches))
        src, dst = self.links.src, self.links.dst
        # Of a cable's two links one runs up the numbering; a negative end is a port with nothing behind it.
        up = (src >= 0) & (src < dst)
        g.add_edges_from_no_data(list(zip(src[up].tolist(), dst[up].tolist())))
        return g


def check_positive(value: float, field: str, example: str) -> None:
    if not value > 0:
        raise UserError(f"{field}: must be positive, got {quoted(value)}; e.g. {example}")


def check_latency(value: float, field: str, example: str = "'1 us'") -> None:
    if not (value >= 0 and np.isfinite(value)):
        raise UserError(f"{field}: must be a finite duration >= 0, got {quoted(value)}; e.g. {example}")


def check_whole(value: int, field: str, lowest: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest:
        more = f"; {hint}" if hint else ""
        raise UserError(f"{field}: must be a whole number >= {lowest}, got {quoted(value)}{more}")
