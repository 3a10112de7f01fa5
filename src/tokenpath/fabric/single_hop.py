"""Single-hop domains: every chip on one non-blocking switch (NVSwitch, NVL72), or wired to every
other chip (xGMI-, UB-Mesh-style full mesh)."""

from __future__ import annotations

import numpy as np

from tokenpath.fabric.spec import NVLS_TUNER_EFFICIENCY
from tokenpath.fabric.topology import LinkTable, Topology, check_positive, check_whole


class Switch(Topology):
    """`hosts` chips, each with one port of `link_bw_Bps` per direction into one non-blocking switch; `nvls`:
    it reduces in the switch, where its chips' `generation` has that reduction (NVLS_TUNER_EFFICIENCY: Hopper,
    Blackwell; Ampere and the chips NCCL does not run on have none), at NCCL's rating of that generation; the
    runtime's tuner rates its other figures by the generation too (tuner.py)."""

    kind = "switch"
    tier_names = ("host",)
    direct = False
    scale_up = True
    single_hop = True

    def __init__(self, hosts: int, link_bw_Bps: float, link_latency_s: float, nvls: bool = True,
                 generation: str = "Hopper") -> None:
        check_whole(hosts, "fabric.hosts", 1)
        check_positive(link_bw_Bps, "fabric.link_bw", "'450 GB/s'")
        self.hosts, self.switches, self.routers = hosts, 1, 1
        self.generation = generation
        self.nvls = nvls and generation in NVLS_TUNER_EFFICIENCY
        self.nvls_efficiency = NVLS_TUNER_EFFICIENCY.get(generation, 0.0)
        self.link_bw_Bps = link_bw_Bps
        self.host_router = np.zeros(hosts, np.int64)
        table = LinkTable()
        table.add_cables(np.arange(hosts), np.full(hosts, hosts), link_bw_Bps, link_latency_s, 0)
        self.links = table.build()

    def diameter(self) -> int:
        return 2 if self.hosts > 1 else 0

    def avg_hops(self) -> float:
        return 2.0 if self.hosts > 1 else 0.0

    def bisection_bw_Bps(self) -> float:
        return (self.hosts // 2) * self.link_bw_Bps

    def route(self, src: int, dst: int) -> dict[int, float]:
        return {} if src == dst else {self.host_links(src)[0]: 1.0, self.host_links(dst)[1]: 1.0}

    def router_link_loads(self, router_bytes: np.ndarray) -> np.ndarray:
        return np.zeros(len(self.links))


class FullMesh(Topology):
    """`hosts` chips with a direct cable of `link_bw_Bps` per direction between every pair; `generation`: its
    chips' (tuner.py)."""

    kind = "fullmesh"
    tier_names = ("mesh",)
    direct = True
    scale_up = True
    single_hop = True
    switches = 0

    def __init__(self, hosts: int, link_bw_Bps: float, link_latency_s: float, generation: str = "") -> None:
        check_whole(hosts, "fabric.hosts", 2)
        check_positive(link_bw_Bps, "fabric.link_bw", "'64 GB/s'")
        self.hosts = self.routers = hosts
        self.generation = generation
        self.link_bw_Bps = link_bw_Bps
        self.host_router = np.arange(hosts)
        a, b = np.triu_indices(hosts, k=1)
        table = LinkTable()
        table.add_cables(a, b, link_bw_Bps, link_latency_s, 0)
        self.links = table.build()
        # link_index[i, j]: the link i -> j.
        n = len(a)
        self._link_index = np.full((hosts, hosts), -1, np.int64)
        self._link_index[a, b] = np.arange(n)
        self._link_index[b, a] = n + np.arange(n)

    def diameter(self) -> int:
        return 1

    def avg_hops(self) -> float:
        return 1.0

    def bisection_bw_Bps(self) -> float:
        half = self.hosts // 2
        return half * (self.hosts - half) * self.link_bw_Bps

    def route(self, src: int, dst: int) -> dict[int, float]:
        return {} if src == dst else {int(self._link_index[src, dst]): 1.0}

    def router_link_loads(self, router_bytes: np.ndarray) -> np.ndarray:
        loads = np.zeros(len(self.links))
        off = ~np.eye(self.hosts, dtype=bool)
        np.add.at(loads, self._link_index[off], router_bytes[off])
        return loads
