"""A scale-up domain per node inside a scale-out network (e.g. 8-GPU NVSwitch nodes on a rail fat tree).

Chips are numbered node by node: chip `n * per_node + i` is local chip i of node n. Every chip also has
its own NIC on the scale-out network. With `rails`, NIC i of every node sits on rail i: the network's
hosts are taken rail by rail (network host `i * nodes + n`), so on a leaf-spine each rail is a leaf, as
in rail-optimized clusters; without, a node's NICs are consecutive network hosts.

Traffic between chips of one node crosses the node's domain; between nodes, the two NICs and the
network route. Routers here are the chips themselves (nothing is folded), since a chip belongs to both
domains: this suits clusters up to a few thousand chips.
"""

from __future__ import annotations

import numpy as np

from tokenpath.config.errors import UserError, quoted
from tokenpath.fabric.topology import Links, Topology, Traffic


class Hierarchy(Topology):
    kind = "hierarchy"
    direct = True  # host links belong to the parts; link_loads adds them there
    scale_up = False  # the nodes' links are; see scale_up_links
    single_hop = False

    def __init__(self, nodes: int, node: Topology, network: Topology, rails: bool = True) -> None:
        if nodes < 1:
            raise UserError(f"fabric.nodes: must be a whole number >= 1, got {quoted(nodes)}")
        if network.hosts < nodes * node.hosts:
            raise UserError(f"fabric.network: {nodes} nodes of {node.hosts} chips need {nodes * node.hosts} NICs "
                            f"but the network has {network.hosts} hosts; enlarge it or lower fabric.nodes")
        self.nodes, self.node, self.network, self.rails = nodes, node, network, rails
        self.generation = node.generation  # the chips' (tuner.py)
        self.per_node = node.hosts
        self.hosts = self.routers = nodes * node.hosts
        self.host_router = np.arange(self.hosts)
        self.switches = nodes * node.switches + network.switches
        chip = np.arange(self.hosts)
        local, which = chip % self.per_node, chip // self.per_node
        self.nic = local * nodes + which if rails else chip  # network host of each chip
        self.tier_names = (tuple(f"node {t}" for t in node.tier_names)
                           + tuple(f"network {t}" for t in network.tier_names))

        # Node ids: chips, then each node's switches, then the network's switches.
        blocks = []
        for n in range(nodes):
            sub = node.links
            ids = np.concatenate([n * self.per_node + np.arange(node.hosts),
                                  self.hosts + n * node.switches + np.arange(node.switches)])
            blocks.append((ids[sub.src], ids[sub.dst], sub.bw_Bps, sub.latency_s, sub.tier))
        chip_of_nic = np.full(network.hosts, -1, np.int64)  # spare network hosts stay unreachable
        chip_of_nic[self.nic] = chip
        net_ids = np.concatenate([chip_of_nic, self.hosts + nodes * node.switches + np.arange(network.switches)])
        sub = network.links
        blocks.append((net_ids[sub.src], net_ids[sub.dst], sub.bw_Bps, sub.latency_s,
                       sub.tier + len(node.tier_names)))
        self.links = Links(*(np.concatenate(c) for c in zip(*blocks)))
        self._node_links = len(node.links)
        self._network_offset = nodes * self._node_links

    # -- structure -------------------------------------------------------------------------------
    def diameter(self) -> int:
        return max(self.node.diameter(), self.network.diameter()) if self.nodes > 1 else self.node.diameter()

    def avg_hops(self) -> float:
        """Exact mean over distinct chip pairs: the node's routes inside, the network's across."""
        g, n = self.per_node, self.nodes
        inside = g * (g - 1) * n
        across = self.hosts * (self.hosts - 1) - inside
        if across == 0:
            return self.node.avg_hops()
        # Network hops depend only on the two NICs' routers: count cross-node chip pairs per router pair.
        net = self.network
        routers = net.host_router[self.nic]
        per_node_router = np.zeros((n, net.routers))
        np.add.at(per_node_router, (np.arange(self.hosts) // g, routers), 1.0)
        everywhere = per_node_router.sum(axis=0)
        pairs = np.multiply.outer(everywhere, everywhere) - per_node_router.T @ per_node_router
        a_host = np.zeros(net.routers, np.int64)
        a_host[routers] = self.nic
        total = 0.0
        for rs, rd in zip(*np.nonzero(pairs)):
            if rs == rd:  # two NICs on one router (never the same NIC: they are in different nodes)
                hops = 2
            else:
                hops = net.hops(int(a_host[rs]), int(a_host[rd]))
            total += pairs[rs, rd] * hops
        return (self.node.avg_hops() * inside + total) / (inside + across)

    @property
    def nic_bw_Bps(self) -> float:
        """A chip's NIC, per direction: the network's slowest host link."""
        return float(self.network.links.bw_Bps[: self.network.hosts].min())

    def bisection_bw_Bps(self) -> float:
        """Halves of whole nodes: the network's bisection, capped by the NICs of half the chips."""
        if self.nodes == 1:
            return self.node.bisection_bw_Bps()
        return min(self.network.bisection_bw_Bps(), (self.hosts // 2) * self.nic_bw_Bps)

    def scale_up_links(self) -> np.ndarray:
        """The nodes' links as their node's; every network link is NIC-class, whatever its kind."""
        return np.concatenate([np.tile(self.node.scale_up_links(), self.nodes),
                               np.zeros(len(self.network.links), bool)])

    @property
    def cables(self) -> int:
        """Cables in use: a spare network port (no chip behind it) is not counted."""
        return int(((self.links.src >= 0) & (self.links.dst >= 0)).sum()) // 2

    # -- routing ---------------------------------------------------------------------------------
    def node_of(self, host: int) -> int:
        return host // self.per_node

    def route(self, src: int, dst: int) -> dict[int, float]:
        if src == dst:
            return {}
        if self.node_of(src) == self.node_of(dst):
            offset = self.node_of(src) * self._node_links
            inner = self.node.route(src % self.per_node, dst % self.per_node)
            return {offset + link: f for link, f in inner.items()}
        inner = self.network.route(int(self.nic[src]), int(self.nic[dst]))
        return {self._network_offset + link: f for link, f in inner.items()}

    def router_link_loads(self, router_bytes: np.ndarray) -> np.ndarray:
        g = self.per_node
        loads = np.zeros(len(self.links))
        blocks = router_bytes.reshape(self.nodes, g, self.nodes, g)
        for n in range(self.nodes):
            inner = _traffic_of(self.node, blocks[n, :, n, :])
            loads[n * self._node_links:(n + 1) * self._node_links] = self.node.link_loads(inner)
        across = router_bytes.copy()
        across.reshape(self.nodes, g, self.nodes, g)[np.arange(self.nodes), :, np.arange(self.nodes), :] = 0.0
        on_network = np.zeros((self.network.hosts, self.network.hosts))
        on_network[np.ix_(self.nic, self.nic)] = across
        loads[self._network_offset:] = self.network.link_loads(_traffic_of(self.network, on_network))
        return loads

    def longest_routes(self, across: bool) -> tuple[int, slice]:
        """Most links on a route between nodes (the network's) or inside one (a node's), and the indices of
        the links such routes cross."""
        if across:
            return self.network.max_route_links(), slice(self._network_offset, None)
        return self.node.max_route_links(), slice(0, self._network_offset)

    def within_nodes(self, groups: np.ndarray) -> bool:
        nodes = groups // self.per_node
        return bool((nodes == nodes[:, :1]).all())


def _traffic_of(topology: Topology, host_bytes: np.ndarray) -> Traffic:
    """Fold a host-by-host byte matrix (diagonal ignored) onto `topology`'s routers."""
    host_bytes = host_bytes.copy()
    np.fill_diagonal(host_bytes, 0.0)
    src, dst = np.nonzero(host_bytes)
    return Traffic.from_flows(topology, src, dst, host_bytes[src, dst])
