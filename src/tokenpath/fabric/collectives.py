"""Collectives as traffic on the actual topology: alpha-beta times that see congestion.

An algorithm is a list of rounds; each round is a set of concurrent flows between ranks, repeated
`count` times. A round takes the latency of its longest route plus its busiest link's bytes over that
link's achievable bandwidth; rounds run one after another. Loads come from the topology's own routing,
so a ring whose neighbours share an uplink, an oversubscribed tier, or several groups running at once
(`groups`, e.g. the tensor-parallel groups of every data-parallel replica) all show in the time.

Every round's bytes scale with the message size, so for one set of groups each algorithm costs
`alpha_s + size_bytes * beta_s_per_byte` under each protocol it runs (NCCL's trees at each size over the
share of it their tuner measured them to reach there); `Collectives.cost` computes the pairs once. NCCL runs
its ring and tree under three protocols (tuner.PROTOCOLS): LL, at the links' own latency but half their
bandwidth, LL128, and Simple, which moves the full bandwidth after a longer synchronisation per step; what
its tuner states of its algorithms' speed beyond that, its factors and ceilings, tuner.py applies to the
links' bandwidth. Chips RCCL runs on (AMD's) take RCCL's protocols and its tuner's figures instead
(tuner.RCCL_PROTOCOLS). At each size the runtime takes the protocol its tuner rates fastest,
and `auto` the cheapest algorithm, as NCCL's tuner does, among what NCCL runs where it can run
(AUTO_ALGORITHMS: the ring; the tree, for all-reduce; NVLS inside a node and NVLSTree across nodes, for
all-reduce) or, on a torus or mesh, also the bucket algorithm TPU runtimes use. The hierarchical path
and recursive halving-doubling (MPI, Gloo), no algorithm of NCCL's, run only when asked for; an
all-to-all runs directly, or with the fixed cost of DeepEP-style low-latency kernels when asked for.

Constants are named with their source and shared by every topology.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tokenpath.config.assumptions import assumed, default
from tokenpath.config.errors import UserError, quoted
from tokenpath.fabric.hierarchy import Hierarchy
from tokenpath.fabric.single_hop import FullMesh
from tokenpath.fabric.spec import NVLS_TUNER_EFFICIENCY
from tokenpath.fabric.topology import Topology, Traffic
from tokenpath.fabric.tuner import (
    NCCL_COMPUTE_CAPABILITY,
    PROTOCOL_ALGORITHMS,
    SIMPLE,
    Protocol,
    Span,
    Tuner,
    corrected_bytes,
)

# NCCL src/graph/tuning.cc: base latency of one collective launch (Ring, LL protocol).
BASE_LATENCY_S = default("base_latency_s")
# The same under RCCL, on the chips it runs on (tuner.runs_rccl): ROCm/rccl src/graph/tuning.cc baseLat,
# Ring and Tree under LL, 12.0 us (Simple 17.0: tuner.RCCL_PROTOCOLS).
RCCL_BASE_LATENCY_S = default("rccl_base_latency_s")
# NVLS (in-switch reduction) latency, Simple being its only protocol: tuning.cc hwLatencies NVLINK / NVLS
# / Simple, 25 us, with no base latency. For small messages NCCL so keeps the ring with LL (6.6 + 0.6 us
# per step), as nccl-tests shows on 8 H100s: 15.6 us at 512 B (AIConfigurator's measured table,
# aiconfigurator-core 0.12.0, systems/data/h100_sxm/comm/nccl/2.29.2). NVLS forced on a tiny message
# with CUDA graphs measures less (6 us on 2 H100s, NVIDIA/nccl issue 1259), a pipelined one more
# (benchmarks/aiconfigurator_nccl.py).
NVLS_LATENCY_S = default("nvls_latency_s")
# NVLSTree's latency per network step of its inter-node tree: NCCL src/graph/tuning.cc, hwLatencies
# NET / NVLSTree / Simple (NVLS runs the Simple protocol only), 20.9 us; 2 * log2(nodes) steps.
NVLS_TREE_NET_STEP_LATENCY_S = default("nvls_tree_net_step_latency_s")
# The least time NCCL's tuner gives a step of a ring across nodes that stays inside a node: every step still
# launches the network proxy's work. src/graph/tuning.cc getNetOverhead: 1.0 us on Intel x86 and any CPU it
# does not name, 2.0 us on AMD (NCCL_NET_OVERHEAD overrides it); x3 under Simple (Protocol.net_overhead_factor).
NET_OVERHEAD_S = default("net_overhead_s")
# Achieved fraction of the per-direction NVLink bandwidth at large sizes, from nccl-tests on 8x H100 SXM
# (450 GB/s per direction): ring all-reduce busbw 370 GB/s (nccl-tests issues 212, 309).
SCALEUP_BW_EFFICIENCY = default("scaleup_bw_efficiency")
# The same for NVLS. An NVLS all-reduce of n ranks moves (1 + 1/n) x its size over each host link and
# direction (NVIDIA/nccl issue 2140): a rank's buffer goes up to be reduced and its 1/n slice of the sum
# comes back, then it stores that slice to all and receives every other slice. Set on 8x H100's busbw
# of 480 GB/s (nccl-tests issue 212): algbw 480 / (2*7/8) = 274 GB/s, i.e. 309 GB/s of link traffic.
# The factor gives the algbw measured with 5, 6 and 7 GPUs (258, 265, 270 GB/s; nccl issue 1455) within 1%.
# Measured on Hopper, it is scaled by a switch's NVLS rating against Hopper's (NVLS_TUNER_EFFICIENCY:
# Blackwell's NVLS runs at 0.74 / 0.85 of Hopper's share of its links).
NVLS_LINK_EFFICIENCY = default("nvls_link_efficiency")
# A 400 Gb/s (50 GB/s) InfiniBand NIC reaches 46-48 GB/s busbw (nccl-tests issue 290).
SCALEOUT_BW_EFFICIENCY = default("scaleout_bw_efficiency")
# Fixed cost of one call of DeepEP's low-latency dispatch or combine kernel beyond the all-to-all's own
# alpha-beta time (issuing one message per routed token copy, then waiting for every rank's completion
# flags before unpacking). DeepEP's published H800 low-latency times sit 35-45 us above their bytes at
# this model's link rates from EP8 to EP64, dispatch and combine alike. Set on its EP8 dispatch row
# (77 us, of which the plain all-to-all is 46.3 us); the other rows are predicted (tokenpath validate).
LOW_LATENCY_ALL_TO_ALL_S = default("low_latency_all_to_all_s")
# Above this many flows a round's latency is bounded by the topology's diameter instead of routing each.
_ROUTED_LATENCY_FLOWS = 1024

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
ALGORITHMS = ("auto", "ring", "tree", "halving_doubling", "nvls", "nvls_tree", "bucket", "hierarchical", "direct",
              "low_latency")
# The algorithms that reduce in the switches: runnable only where the runtime may use NVLS.
NVLS_ALGORITHMS = ("nvls", "nvls_tree")
# What `auto` chooses from, where each can run. NCCL's tuner rates Tree, Ring, CollNetDirect, CollNetChain,
# NVLS, NVLSTree and PAT (src/graph/tuning.cc ncclTopoTuneModel) and runs the cheapest it has enabled
# (src/enqueue.cc updateCollCostTable, topoGetAlgoInfo); of these the model runs the ring, the tree, NVLS and
# NVLSTree. CollNet needs a SHARP plugin (NCCL_COLLNET_ENABLE, off by default) and PAT serves all-gather and
# reduce-scatter with one GPU per node (tuning.cc ncclPatEnable): neither is modelled. The bucket algorithm is
# what TPU runtimes run on a torus or mesh, the only topologies that offer it. NCCL has no hierarchical path
# and no halving-doubling (MPI's, Gloo's): those run only when named.
AUTO_ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "bucket")


@dataclass(frozen=True)
class Round:
    """Concurrent flows src[i] -> dst[i], each carrying `fraction` of the message (or fraction[i]), `count`
    times over, paying route latency `steps` times (default: once per repetition; a pipelined pass
    differs): each time that of the round's longest route. On a hierarchy `inter_steps` of the steps, if
    given, pay the longest route of the flows between nodes and the others that of the flows inside a
    node, as NCCL's tuner counts a ring's and a tree's steps across nodes (Collectives._steps_latency_s)."""

    src: np.ndarray
    dst: np.ndarray
    fraction: float | np.ndarray
    count: int
    steps: int | None = None
    inter_steps: int | None = None


@dataclass(frozen=True)
class AffineCost:
    """time_s(size) = alpha_s + size_bytes * beta_s_per_byte (zero when nothing moves); for NCCL's tree
    all-reduce the bandwidth term at each size over the share of it the tree reaches there, `corrections`
    (tuner.Tuner.corrections: log2(size / 64) -> share, on the line between powers of two:
    tuner.corrected_bytes; empty: all of it)."""

    alpha_s: float
    beta_s_per_byte: float
    corrections: tuple[float, ...] = ()

    def time_s(self, size_bytes: float) -> float:
        if size_bytes <= 0:
            return 0.0
        if self.corrections:
            return self.alpha_s + corrected_bytes(self.corrections, size_bytes) * self.beta_s_per_byte
        return self.alpha_s + size_bytes * self.beta_s_per_byte


def fastest_s(costs: Sequence[AffineCost], size_bytes: float) -> float:
    """The least time of `costs` at `size_bytes` (Collectives.candidates: what NCCL's tuner picks from)."""
    return min(cost.time_s(size_bytes) for cost in costs)


def bus_bandwidth_factor(op: str, ranks: int) -> float:
    """nccl-tests busbw = algbw * factor (doc/PERFORMANCE.md), so it compares with link bandwidth."""
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op == "send_recv":
        return 1.0
    return (ranks - 1) / ranks


# -- algorithms as rounds over rank indices -----------------------------------------------------------

def _ring(op: str, n: int) -> list[Round]:
    ranks = np.arange(n)
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    return [Round(ranks, (ranks + 1) % n, 1.0 / n, steps)]


def _mesh_rings(op: str, n: int) -> list[Round]:
    """The ring on a full mesh, as RCCL runs it over xGMI: channels that go round the ranks in different
    orders, so each rank's links to the others all carry a ring, each ring its share of the message; the
    steps, and so the latency, are one ring's. The n(n - 1) one-way links of n ranks split into n - 1
    rings sharing no link for every n but 4 and 6 (Tillson, 1980), where the most are 2 and 4: one and
    two rings, each way round."""
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    src, dst = _mesh_ring_links(n)
    return [Round(src, dst, 1.0 / (n * (len(src) // n)), steps)]


def _mesh_ring_links(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The one-way links the rings of _mesh_rings use, each once: every one (n - 1 rings' worth), or for 4
    and 6 ranks those of rings sharing no link (0-1-2-3; 0-1-2-3-4-5 and 0-2-4-1-5-3), each way round."""
    if n not in (4, 6):
        src = np.repeat(np.arange(n), n - 1)
        return src, (src + np.tile(np.arange(1, n), n)) % n
    cycles = [np.arange(4)] if n == 4 else [np.arange(6), np.array([0, 2, 4, 1, 5, 3])]
    ahead = [np.roll(c, -1) for c in cycles]
    return np.concatenate([*cycles, *ahead]), np.concatenate([*ahead, *cycles])


def _rail_rings(op: str, hier: Hierarchy, group: np.ndarray) -> list[Round]:
    """NCCL's rings across nodes: one channel per local rank of the node with the fewest of the group's
    ranks, each carrying 1/m of the message over all n ranks (every rank searches its own rings, and
    init.cc keeps the fewest channels any rank found: `graphs[a]->nChannels = std::min(...)`, "so that the
    tuning is consistent across ranks"). Each channel crosses between nodes rail to rail (it leaves a node
    from the local rank it enters the next one at) and visits the other ranks of a node over its scale-up
    links, and the channels leave from different local ranks: each NIC carries at most one channel's
    crossing each way."""
    per_node = _ranks_by_node(hier, group)
    m = min(len(ranks) for ranks in per_node)
    n, q = len(group), len(per_node)
    # Channel c enters node k at local (c - k) mod (its ranks there) and leaves from the local before that.
    channels = [np.concatenate([np.roll(ranks, -((c - k) % len(ranks))) for k, ranks in enumerate(per_node)])
                for c in range(m)]
    src = np.concatenate(channels)
    dst = np.concatenate([np.roll(ring, -1) for ring in channels])
    # NCCL's tuner (tuning.cc ncclTopoTuneModel) counts nsteps = 2 (n - 1) or n - 1, of which
    # nInterSteps = 2 (nNodes - 1) or nNodes - 1 cross between nodes: a chunk's way round skips one crossing.
    steps, inter_steps = (2 * (n - 1), 2 * (q - 1)) if op == "all_reduce" else (n - 1, q - 1)
    return [Round(src, dst, 1.0 / (n * m), steps, inter_steps=inter_steps if q > 1 else None)]


def _ranks_by_node(hier: Hierarchy, group: np.ndarray) -> list[np.ndarray]:
    """Indices into `group` of its ranks on each node it spans, node by node, each in the group's order."""
    nodes = group // hier.per_node
    order = np.argsort(nodes, kind="stable")
    return np.split(order, np.cumsum(np.bincount(nodes)[np.unique(nodes)])[:-1])


def _tree(n: int, chain: bool = False) -> list[Round]:
    """NCCL's double binary tree all-reduce: two complementary trees each reduce then broadcast half the
    message, pipelined, so every tree edge carries its half up and down once; latency 2 * depth steps, the
    depth of a binary tree of n ranks in heap order being floor(log2 n) (tuning.cc: log2i(nNodes), each
    rank its own node, as on a fat tree; on a hierarchy _tree_across_nodes takes NCCL's shape).
    With `chain` (ranks inside one scale-up domain) the latency is that of NCCL's tree there, which
    chains a node's ranks: 2 * (n - 1) steps (tuning.cc: 2 * (nRanks/nNodes - 1) * intraLat)."""
    depth = n - 1 if chain else n.bit_length() - 1
    child = np.arange(1, n)
    parent = (child - 1) // 2
    # The second tree mirrors the first (rank i -> n-1-i), so a rank inner in one is a leaf in the other.
    a = np.concatenate([child, n - 1 - child])
    b = np.concatenate([parent, n - 1 - parent])
    return [Round(np.concatenate([a, b]), np.concatenate([b, a]), 0.5, count=1, steps=2 * depth)]


def _tree_across_nodes(hier: Hierarchy, group: np.ndarray) -> list[Round]:
    """NCCL's tree all-reduce over ranks on several nodes (src/graph/connect.cc connectTrees, src/graph/trees.cc
    ncclGetDtree): per channel, a chain through each node's ranks whose head joins a double binary tree of the
    nodes, every channel on both trees (channels c and c + nChannels), half its share on each. One channel per
    local rank of the node with the fewest of the group's ranks, as the rings (_rail_rings); channel c's chains
    start at local c, so each channel reaches the network through its own rank's NIC (search.cc's tree graph:
    NET n -> GPU a -> GPU b -> ..., and GPU a -> NET n). Each chain link carries a channel's share each way
    (reduce up, broadcast down, half in each tree); each edge between heads half of it each way in each tree,
    as in _tree. Steps as NCCL's tuner counts them (tuning.cc ncclTopoTuneModel; connectTrees' depth):
    2 * ((nRanks/nNodes - 1) inside a node + log2i(nNodes) between nodes)."""
    per_node = _ranks_by_node(hier, group)
    m, q = min(len(ranks) for ranks in per_node), len(per_node)
    across = _tree(q)[0]  # its flows between nodes 0..q-1, each carrying `fraction`
    src, dst, fraction = [], [], []
    for c in range(m):
        chains = [np.roll(ranks, -(c % len(ranks))) for ranks in per_node]
        heads = np.array([chain[0] for chain in chains])
        up = np.concatenate([chain[1:] for chain in chains])  # each chain link, toward the head and back
        down = np.concatenate([chain[:-1] for chain in chains])
        for a, b, f in ((heads[across.src], heads[across.dst], across.fraction),
                        (np.concatenate([up, down]), np.concatenate([down, up]), 1.0)):
            src.append(a)
            dst.append(b)
            fraction.append(np.full(len(a), f / m))
    inter_steps = 2 * (q.bit_length() - 1)
    return [Round(np.concatenate(src), np.concatenate(dst), np.concatenate(fraction), count=1,
                  steps=2 * (len(group) // q - 1) + inter_steps, inter_steps=inter_steps)]


def _halving_doubling(op: str, n: int) -> list[Round]:
    """Recursive halving (reduce-scatter) then doubling (all-gather): log2(n) exchanges each way with the
    partner at distance n/2, n/4, ..., the message halving each time (Rabenseifner)."""
    ranks = np.arange(n)
    steps = int(math.log2(n))
    rs = [Round(ranks, ranks ^ (n >> (k + 1)), 1.0 / (2 ** (k + 1)), 1) for k in range(steps)]
    if op == "reduce_scatter":
        return rs
    ag = rs[::-1]
    return ag if op == "all_gather" else rs + ag


def _send_recv(n: int) -> list[Round]:
    ranks = np.arange(n)
    return [Round(ranks[:-1], ranks[1:], 1.0, 1)]


class Collectives:
    """Collective costs on `topology`. `bw_efficiency` is the achievable fraction of every link's
    bandwidth (a scalar or one value per link); default: by the kind of link (see link_efficiency).
    `nvls`: whether the runtime may reduce in the switches where the topology has NVLS (false: as NCCL
    runs with NCCL_NVLS_ENABLE=0, which SGLang sets, engine/profiles.py)."""

    def __init__(self, topology: Topology, algorithm: str = "auto", bw_efficiency: float | np.ndarray | None = None,
                 nvls: bool = True):
        if algorithm not in ALGORITHMS:
            raise UserError(f"fabric.algorithm: unknown {quoted(algorithm)}; use one of {', '.join(ALGORITHMS)}")
        self.topology = topology
        self.algorithm = algorithm
        self.nvls = nvls
        # The assumptions the costs use, read once here: a built Collectives keeps its run's values.
        self.tuner = Tuner(topology.generation)
        self.base_latency_s = (assumed("rccl_base_latency_s", RCCL_BASE_LATENCY_S) if self.tuner.rccl
                               else assumed("base_latency_s", BASE_LATENCY_S))
        self.nvls_latency_s = assumed("nvls_latency_s", NVLS_LATENCY_S)
        self.nvls_tree_net_step_latency_s = assumed("nvls_tree_net_step_latency_s", NVLS_TREE_NET_STEP_LATENCY_S)
        self.nvls_link_efficiency = assumed("nvls_link_efficiency", NVLS_LINK_EFFICIENCY)
        self.low_latency_all_to_all_s = assumed("low_latency_all_to_all_s", LOW_LATENCY_ALL_TO_ALL_S)
        self.net_overhead_s = assumed("net_overhead_s", NET_OVERHEAD_S)
        eff = link_efficiency(topology) if bw_efficiency is None else bw_efficiency
        self._capacity_Bps = topology.links.bw_Bps * eff
        self._costs = lru_cache(maxsize=4096)(self._costs_uncached)
        # Each link's latency under each protocol (Protocol), for the ring's steps and the tree's.
        scale_up = topology.scale_up_links()
        latency_s = topology.links.latency_s
        self._step_latency_s = {
            (p.name, algorithm): latency_s * np.where(scale_up, ratio[0], ratio[1])
            for p in self.tuner.protocols
            for algorithm, ratio in (("ring", p.ring_step_ratio), ("tree", p.tree_step_ratio))}
        self._across_nodes = not bool(scale_up.all())
        if isinstance(topology, Hierarchy):  # groups inside one node run on that node alone
            node_eff = eff if np.ndim(eff) == 0 else np.asarray(eff)[: len(topology.node.links)]
            self._inside = Collectives(topology.node, "auto", node_eff, nvls)

    # -- public -----------------------------------------------------------------------------
    def available(self, op: str, ranks: int) -> list[str]:
        """Algorithms that can run `op` over `ranks` ranks on this topology."""
        _check_op(op)
        if op == "send_recv":
            return ["direct"]
        if op == "all_to_all":
            return ["direct", "low_latency"]
        names = ["ring"]
        if op == "all_reduce":
            names.append("tree")
            if self.topology.nvls and self.nvls:
                names.append("nvls")
        if ranks & (ranks - 1) == 0:
            names.append("halving_doubling")
        if self.topology.dims:
            names.append("bucket")
        if isinstance(self.topology, Hierarchy):
            names.append("hierarchical")
            if op == "all_reduce" and self.topology.node.nvls and self.nvls:
                names.append("nvls_tree")
        return names

    def cost(self, op: str, groups: Sequence[Sequence[int]], algorithm: str | None = None,
             size_bytes: float = 2**20) -> AffineCost:
        """Cost of `op` run at once by every group of `groups` (host lists of equal size) as it runs at
        `size_bytes`: under its fastest protocol there (`auto`: the algorithm chosen there too);
        `algorithm` defaults to the one this instance was made with."""
        return self._fastest(op, size_bytes, groups, algorithm)[1]

    def costs(self, op: str, groups: Sequence[Sequence[int]], algorithm: str | None = None) -> dict[str, AffineCost]:
        """The cost of `op` under each protocol the algorithm runs, by name: the runtime's for its ring and
        tree (tuner.PROTOCOLS, NCCL's; RCCL_PROTOCOLS, RCCL's), "Simple" alone for the rest (NVLS, NVLSTree and
        point-to-point run it; the other algorithms are priced one way, at the links' latency). `auto`: the
        algorithm chosen at 1 MiB."""
        key = tuple(tuple(int(h) for h in g) for g in groups)
        return self._costs(op, key, self.runs_as(op, groups, algorithm or self.algorithm))

    def protocol(self, op: str, size_bytes: float, groups: Sequence[Sequence[int]],
                 algorithm: str | None = None) -> str:
        """The protocol that runs `op` at this size: the fastest of the algorithm that runs it."""
        return self._fastest(op, size_bytes, groups, algorithm)[0]

    def _fastest(self, op: str, size_bytes: float, groups: Sequence[Sequence[int]],
                 algorithm: str | None) -> tuple[str, AffineCost]:
        """The protocol that runs `op` at this size, by name, and its cost (`auto`: under the algorithm
        chosen at this size)."""
        costs = self.costs(op, groups, self.choose(op, size_bytes, groups, algorithm or self.algorithm))
        return min(costs.items(), key=lambda item: item[1].time_s(size_bytes))

    def runs_as(self, op: str, groups: Sequence[Sequence[int]], algorithm: str) -> str:
        """The algorithm that actually runs when `algorithm` is asked for (auto stays auto)."""
        if op == "all_to_all" and algorithm == "low_latency":
            return algorithm
        if op in ("all_to_all", "send_recv"):
            return "direct"  # point-to-point whatever the reduction algorithm
        if algorithm in ("nvls", "nvls_tree", "tree") and op != "all_reduce":
            return "ring"  # in-switch reduction and NCCL's trees serve all-reduce only
        if algorithm in ("hierarchical", "nvls_tree") and isinstance(self.topology, Hierarchy) \
                and self.topology.within_nodes(np.array(groups, np.int64)):
            # A group inside one node has no inter-node stage.
            return "ring" if algorithm == "hierarchical" else "nvls"
        return algorithm

    def time_s(self, op: str, size_bytes: float, groups: Sequence[Sequence[int]],
               algorithm: str | None = None) -> float:
        """Time of one collective of `size_bytes` per rank (nccl-tests' size) run by each group."""
        return fastest_s(self.candidates(op, groups, algorithm), size_bytes)

    def candidates(self, op: str, groups: Sequence[Sequence[int]],
                   algorithm: str | None = None) -> tuple[AffineCost, ...]:
        """Every cost `op` can run at over these groups, whatever its size: each protocol of the algorithm that
        runs it, or (`auto`) of each algorithm NCCL's tuner chooses from. At a size the fastest of them runs
        (fastest_s): the tuner's algorithm there, under its fastest protocol there. An engine step's sizes
        differ step to step: its costs read these once (engine/costs.py)."""
        algorithm = algorithm or self.algorithm
        auto = algorithm == "auto" and op not in ("all_to_all", "send_recv")
        names = self._auto_candidates(op, groups) if auto else [algorithm]
        return tuple(cost for name in names for cost in self.costs(op, groups, name).values())

    def choose(self, op: str, size_bytes: float, groups: Sequence[Sequence[int]], algorithm: str = "auto") -> str:
        """The algorithm that runs at this size: for `auto` the one NCCL's tuner would pick (the fastest,
        each under its fastest protocol), else what `algorithm` runs as."""
        if algorithm != "auto" or op in ("all_to_all", "send_recv"):
            return self.runs_as(op, groups, algorithm)
        return min(self._auto_candidates(op, groups),
                   key=lambda name: self.cost(op, groups, name, size_bytes).time_s(size_bytes))

    def bus_bandwidth_Bps(self, op: str, size_bytes: float, groups: Sequence[Sequence[int]],
                          algorithm: str | None = None) -> float:
        time_s = self.time_s(op, size_bytes, groups, algorithm)
        ranks = len(groups[0])
        return 0.0 if time_s == 0 else size_bytes / time_s * bus_bandwidth_factor(op, ranks)

    # -- internals --------------------------------------------------------------------------
    def _auto_candidates(self, op: str, groups: Sequence[Sequence[int]]) -> list[str]:
        """What `auto` chooses from: the runnable algorithms an NCCL (or TPU) runtime would use
        (AUTO_ALGORITHMS). Which NCCL enables for the op and the groups, `available` and `_runnable` say."""
        return [a for a in self._runnable(op, groups) if a in AUTO_ALGORITHMS]

    def _runnable(self, op: str, groups: Sequence[Sequence[int]]) -> list[str]:
        """The algorithms that can run `op` for these groups where they sit."""
        hosts = np.array(groups, np.int64)
        if isinstance(self.topology, Hierarchy) and self.topology.within_nodes(hosts):
            return self._inside._runnable(op, hosts % self.topology.per_node)
        names = self.available(op, len(groups[0]))
        if "bucket" in names and _box(self.topology, hosts[0]) is None:
            names.remove("bucket")
        if "hierarchical" in names and not _even_over_nodes(self.topology, hosts[0]):
            names.remove("hierarchical")
        if "nvls_tree" in names and not (_even_over_nodes(self.topology, hosts[0])
                                         and len(hosts[0]) > len(np.unique(hosts[0] // self.topology.per_node))):
            names.remove("nvls_tree")  # NVLS needs two or more ranks on every node
        return names

    def _costs_uncached(self, op: str, groups: tuple[tuple[int, ...], ...], algorithm: str) -> dict[str, AffineCost]:
        _check_op(op)
        n = len(groups[0])
        if any(len(g) != n for g in groups):
            raise ValueError("groups of one collective must have the same size")
        for g in groups:
            self.topology.check_hosts(np.array(g), "placement")
        if n <= 1:
            return {"Simple": AffineCost(0.0, 0.0)}
        hosts = np.array(groups, np.int64)
        if isinstance(self.topology, Hierarchy) and self.topology.within_nodes(hosts):
            return self._inside_nodes(op, hosts, algorithm)
        if algorithm == "auto":
            return self._costs(op, groups, self.choose(op, 2**20, groups))
        if algorithm in ("hierarchical", "nvls_tree") and algorithm in self.available(op, n):
            _node_grid(self.topology, hosts[0], algorithm)  # says what is wrong with the layout, if anything
        if algorithm not in self._runnable(op, groups):
            raise UserError(f"fabric.algorithm: {algorithm!r} cannot run {op} over {n} ranks on a "
                            f"{self.topology.kind}; use one of {', '.join(self._runnable(op, groups))} "
                            "or 'auto'")
        if algorithm == "nvls":
            return {"Simple": self._nvls(groups)}
        if algorithm == "nvls_tree":
            return {"Simple": self._nvls_tree(hosts)}
        if op == "all_to_all":
            direct = self._all_to_all(hosts)
            if algorithm == "low_latency":
                direct = AffineCost(direct.alpha_s + self.low_latency_all_to_all_s, direct.beta_s_per_byte)
            return {"Simple": direct}
        rounds, beta = [], 0.0
        for r in self._rounds(op, algorithm, groups):
            src = hosts[:, r.src].ravel()
            dst = hosts[:, r.dst].ravel()
            fraction = np.tile(r.fraction, len(hosts)) if np.ndim(r.fraction) else r.fraction  # (every group's)
            traffic = Traffic.from_flows(self.topology, src, dst, fraction)
            beta += r.count * float((self.topology.link_loads(traffic) / self._capacity_Bps).max(initial=0.0))
            rounds.append((r, src, dst))

        def alpha_s(latency_s: np.ndarray, inter_latency_s: np.ndarray | None = None, floor_s: float = 0.0) -> float:
            return self.base_latency_s + sum(self._steps_latency_s(r, src, dst, latency_s, inter_latency_s, floor_s)
                                             for r, src, dst in rounds)
        if algorithm not in PROTOCOL_ALGORITHMS:
            return {"Simple": AffineCost(alpha_s(self.topology.links.latency_s), beta)}
        priced_as = PROTOCOL_ALGORITHMS[algorithm]
        tree = priced_as == "tree"
        # A ring across nodes (tuning.cc ncclTopoTuneModel): its steps inside a node take at least the net
        # overhead; with one rank per node (ppn == 1, "latencies are fully exposed") its network steps take
        # the tree's latency there. (The hierarchical path, priced as the ring, has no round of both kinds.)
        one_per_node = isinstance(self.topology, Hierarchy) and len(np.unique(hosts[0] // self.topology.per_node)) == n

        def protocol_alpha_s(p: Protocol) -> float:
            latency_s = self._step_latency_s[p.name, priced_as]
            if tree:
                return p.base_extra_s[1] + alpha_s(latency_s)
            inter_s = self._step_latency_s[p.name, "tree"] if one_per_node else latency_s
            return p.base_extra_s[0] + alpha_s(latency_s, inter_s, self.net_overhead_s * p.net_overhead_factor)

        # The tuner's factors and ceilings on NCCL's ring and tree (tuner.py); the hierarchical path is no
        # algorithm of NCCL's and takes the Protocol table's shares alone.
        span = self._span(hosts[0]) if algorithm in ("ring", "tree") else None
        links_Bps = 1.0 / beta if beta > 0 else math.inf
        nodes = self._nodes(hosts[0])

        def protocol_cost(p: Protocol) -> AffineCost:
            bw = self.tuner.bandwidth_Bps(algorithm, op, p, links_Bps, nodes, span)
            return AffineCost(protocol_alpha_s(p) * self.tuner.latency_factor(algorithm, op, p, span),
                              1.0 / bw, self.tuner.corrections(algorithm, p, span))
        return {p.name: protocol_cost(p) for p in self.tuner.protocols if self.tuner.runs(algorithm, p, nodes)}

    def _nodes(self, group: np.ndarray) -> int:
        """The group's nodes as the tuner counts them (its nNodes): those of a hierarchy it spans; every chip
        its own on a network of NICs alone (a fat tree, a DragonFly); one in a scale-up domain."""
        if isinstance(self.topology, Hierarchy):
            return len(np.unique(group // self.topology.per_node))
        return len(group) if self._across_nodes else 1

    def _span(self, group: np.ndarray) -> Span | None:
        """The group as NCCL's tuner sees it where its chips are of a generation its tables hold a row for
        (tuner.NCCL_COMPUTE_CAPABILITY): inside one scale-up domain, or across the nodes of a hierarchy (a group
        inside one of its nodes runs on that node's Collectives); else None."""
        hier = self.topology
        if hier.generation not in NCCL_COMPUTE_CAPABILITY:
            return None
        if not isinstance(hier, Hierarchy):
            return Span(1, len(group), 0, hier.generation, 0.0) if hier.scale_up else None
        per_node = _ranks_by_node(hier, group)
        if len(per_node) < 2:
            return None
        return Span(len(per_node), len(group), min(len(ranks) for ranks in per_node), hier.generation,
                    hier.nic_bw_Bps)

    def _rounds(self, op: str, algorithm: str, groups: tuple[tuple[int, ...], ...]) -> list[Round]:
        n = len(groups[0])
        if algorithm == "ring":
            if isinstance(self.topology, Hierarchy):
                return _rail_rings(op, self.topology, np.array(groups[0]))
            if isinstance(self.topology, FullMesh):
                return _mesh_rings(op, n)
            return _ring(op, n)
        if algorithm == "tree":
            if isinstance(self.topology, Hierarchy):  # spanning nodes: inside one, _inside_nodes runs it
                return _tree_across_nodes(self.topology, np.array(groups[0]))
            return _tree(n, chain=self.topology.single_hop)
        if algorithm == "halving_doubling":
            return _halving_doubling(op, n)
        if algorithm == "direct":
            return _send_recv(n)
        if algorithm == "bucket":
            return _bucket(op, self.topology, np.array(groups[0]))
        if algorithm == "hierarchical":
            return _hierarchical(op, self.topology, np.array(groups[0]))
        raise AssertionError(algorithm)

    def _inside_nodes(self, op: str, hosts: np.ndarray, algorithm: str) -> dict[str, AffineCost]:
        """Groups that stay inside nodes: each node is on its own, so the slowest node sets the time."""
        hier = self.topology
        inner = self._inside
        if algorithm == "hierarchical":
            algorithm = "ring"
        worst: dict[str, AffineCost] = {}
        nodes = hosts[:, 0] // hier.per_node
        for node in np.unique(nodes):
            local = hosts[nodes == node] % hier.per_node
            for name, cost in inner.costs(op, local.tolist(), algorithm).items():
                worst[name] = max(worst.get(name, cost), cost, key=lambda c: c.time_s(2**20))
        return worst

    def _all_to_all(self, hosts: np.ndarray) -> AffineCost:
        """Every rank sends 1/n of its buffer to every other rank, all at once (NCCL's p2p all-to-all),
        folded per router so large groups cost no more than their routers."""
        n = hosts.shape[1]
        loads = sum(self.topology.link_loads(Traffic.all_to_all(self.topology, 1.0 / n, hosts=g)) for g in hosts)
        if n * n <= _ROUTED_LATENCY_FLOWS:
            src, dst = np.nonzero(~np.eye(n, dtype=bool))
            latency_s = self._round_latency_s(hosts[:, src].ravel(), hosts[:, dst].ravel())
        else:
            latency_s = self.topology.longest_route_latency_s()
        return AffineCost(self.base_latency_s + latency_s, float((loads / self._capacity_Bps).max()))

    def _nvls(self, groups: tuple[tuple[int, ...], ...]) -> AffineCost:
        """In-switch reduction: (1 + 1/n) x the buffer over each rank's host link, each way."""
        hosts = np.array(groups, np.int64).ravel()
        up_down = np.concatenate([hosts, hosts + self.topology.hosts])  # host links (Topology.host_links)
        bw = self.topology.links.bw_Bps[up_down] * self.nvls_link_efficiency * (
            self.topology.nvls_efficiency / NVLS_TUNER_EFFICIENCY["Hopper"])
        return AffineCost(self.nvls_latency_s, (1 + 1 / len(groups[0])) * float((1.0 / bw).max()))

    def _nvls_tree(self, hosts: np.ndarray) -> AffineCost:
        """NCCL's NVLSTree all-reduce across nodes: an in-switch reduction inside each node leaves local
        rank l with slice l of the sum, a double binary tree across nodes all-reduces each slice over
        its own rail, and an in-switch broadcast returns the result. The stages are pipelined, so the
        slower one sets the bandwidth (tuning.cc takes min(intraBw, interBw)), within the tuner's ceiling per
        channel (tuner.py); on Blackwell its time takes the tree's shortfall by size too (ncclTopoGetAlgoTime,
        on x86 CPUs, as the model's other CPU figures assume)."""
        hier = self.topology
        grids = [group[_node_grid(hier, group, "nvls_tree")] for group in hosts]  # grid[node, local] = host
        nodes, per_node = grids[0].shape
        tree = _tree(nodes)[0]
        src = np.concatenate([g[tree.src].ravel() for g in grids])
        dst = np.concatenate([g[tree.dst].ravel() for g in grids])
        loads = self.topology.link_loads(Traffic.from_flows(self.topology, src, dst, tree.fraction / per_node))
        inter_beta = float((loads / self._capacity_Bps).max())
        locals_ = np.concatenate(grids) % hier.per_node
        intra = self._inside._nvls(tuple(map(tuple, locals_.tolist())))
        alpha_s = intra.alpha_s + tree.steps * self.nvls_tree_net_step_latency_s
        span = self._span(hosts[0])
        links_Bps = 1.0 / max(intra.beta_s_per_byte, inter_beta)
        bw = self.tuner.bandwidth_Bps("nvls_tree", "all_reduce", SIMPLE, links_Bps, nodes, span)
        return AffineCost(alpha_s, 1.0 / bw, self.tuner.corrections("nvls_tree", SIMPLE, span))

    def _steps_latency_s(self, r: Round, src: np.ndarray, dst: np.ndarray, latency_s: np.ndarray,
                         inter_latency_s: np.ndarray | None = None, floor_s: float = 0.0) -> float:
        """Latency of round `r`'s steps (its flows src -> dst, every group's) at `latency_s` per link: each
        step that of the round's longest route; or, where `r.inter_steps` is set (a ring or tree spanning
        nodes), as NCCL's tuner prices steps across nodes (src/graph/tuning.cc ncclTopoTuneModel):
        (nsteps - nInterSteps) * intraLat + nInterSteps * interLat, intraLat the longest route of the flows
        inside a node but at least `floor_s` (a ring's net overhead), interLat the longest of the flows
        between nodes, at `inter_latency_s` per link (default `latency_s`)."""
        steps = r.count if r.steps is None else r.steps
        if r.inter_steps is None:
            return steps * self._round_latency_s(src, dst, latency_s)
        across = src // self.topology.per_node != dst // self.topology.per_node
        intra_s = max(self._round_latency_s(src[~across], dst[~across], latency_s, across=False), floor_s)
        inter_s = self._round_latency_s(src[across], dst[across],
                                        latency_s if inter_latency_s is None else inter_latency_s, across=True)
        return (steps - r.inter_steps) * intra_s + r.inter_steps * inter_s

    def _round_latency_s(self, src: np.ndarray, dst: np.ndarray, link_latency_s: np.ndarray | None = None,
                         across: bool | None = None) -> float:
        """Latency of the longest route among the round's flows, at `link_latency_s` per link (default:
        the links' own). `across`: the flows all run between nodes (True) or inside one (False) of a
        hierarchy, which bounds the routes when the flows are too many to route one by one."""
        if link_latency_s is None:
            link_latency_s = self.topology.links.latency_s
        if len(src) > _ROUTED_LATENCY_FLOWS:  # Topology.longest_route_latency_s, at these latencies
            if across is None:
                return self.topology.max_route_links() * float(link_latency_s.max(initial=0.0))
            route_links, links = self.topology.longest_routes(across)
            return route_links * float(link_latency_s[links].max(initial=0.0))
        worst = 0.0
        for s, d in set(zip(src.tolist(), dst.tolist())):
            route = self.topology.route(s, d)
            worst = max(worst, sum(f * link_latency_s[i] for i, f in route.items()))
        return worst


def _box(torus: Topology, group: np.ndarray) -> np.ndarray | None:
    """The group's ranks as an array shaped like the box of torus coordinates it fills, or None."""
    coords = np.stack(np.unravel_index(group, torus.dims), axis=1)
    lows, highs = coords.min(axis=0), coords.max(axis=0)
    extents = highs - lows + 1
    if int(np.prod(extents)) != len(group):
        return None
    box = np.full(tuple(extents), -1, np.int64)
    box[tuple((coords - lows).T)] = np.arange(len(group))
    return None if (box < 0).any() else box


def _bucket(op: str, torus: Topology, group: np.ndarray) -> list[Round]:
    """Per-dimension bucket all-reduce on a box of a torus or mesh: reduce-scatter along each dimension
    in turn over bidirectional rings (half each way), then all-gather back in reverse order.

    Along an axis of extent k a rank sends (k-1)/k of what it still holds, half each way round, then
    holds 1/k of it. Where the axis is a whole ring of the torus the two halves take two links; where it
    is a line (a mesh dimension, or part of a ring) the way back round crosses the same links, which
    carry twice as much. Over the axes the bytes per link telescope: (1 - 1/N)/2 when every axis is a
    ring, what the bidirectional ring over all N chips (the 1-D torus) moves, here in sum(k-1) <= N-1
    steps, so no single ring embedded in the torus is faster. Swapping two adjacent axes changes the
    bytes by a_i a_j (m_i - m_j), with a = 1 - 1/k and m = 1/2 (ring) or 1 (line): rings go first, and
    the order among rings or among lines does not matter to it; among each, shorter axes go first, a
    canonical order, so the sharded passes below pair the same axes however the dims are listed. (The
    dimension-by-dimension schedule is ASTRA-sim's multi-dimensional all-reduce; Rashidi et al.,
    "Themis", ISCA 2022, show its time depends on the dimension order when the dimensions' bandwidths
    differ, as a line's halved bandwidth does here.)

    TPU runtimes split the message into one shard per dimension, shard j starting at dimension j, so
    every dimension's links are busy at once (jax-ml scaling-book "sharding"). The shards run in phases:
    in each, every shard passes along its own dimension, and the phase lasts as long as its slowest
    pass (bytes and steps); on a box of equal sides every pass is alike and the bandwidth term drops by
    the number of dimensions. Where the phases' bytes per link (the pass's, above) come to no less than
    the one shard's rings-first pass, as on a box whose lines are long, the one shard runs.
    """
    box = _box(torus, group)
    if box is None:
        raise UserError("fabric.algorithm: 'bucket' needs each group to fill a box of the torus; use 'ring' or 'auto'")
    whole_ring = [ring and extent == k for extent, k, ring in zip(box.shape, torus.dims, torus.rings)]
    axes = sorted((axis for axis, extent in enumerate(box.shape) if extent > 1),
                  key=lambda axis: (not whole_ring[axis], box.shape[axis]))  # rings first, shorter first

    def ring_flows(axis: int) -> tuple[np.ndarray, np.ndarray]:
        fwd, back = np.roll(box, -1, axis=axis).ravel(), np.roll(box, 1, axis=axis).ravel()
        return np.concatenate([box.ravel(), box.ravel()]), np.concatenate([fwd, back])

    def passes(order: list[int]) -> list[tuple[int, float]]:
        """(axis, the share of the message each rank holds when it starts along it) in `order`."""
        out, share = [], 1.0
        for axis in order:
            out.append((axis, share))
            share /= box.shape[axis]
        return out

    def pass_fraction(axis: int, share: float) -> float:  # each flow's, over the pass's k - 1 steps
        k = box.shape[axis]
        return share * (k - 1) / k / 2

    def link_bytes(axis: int, share: float) -> float:  # per link of the axis: a line's two ways share them
        return pass_fraction(axis, share) * (1 if whole_ring[axis] else 2)

    shards = len(axes)
    phases = list(zip(*(passes(axes[j:] + axes[:j]) for j in range(shards))))  # phases[p][j]: shard j's pass
    sharded_bytes = sum(max(link_bytes(axis, share) for axis, share in phase) for phase in phases) / shards
    if shards > 1 and sharded_bytes < sum(link_bytes(axis, share) for axis, share in passes(axes)):
        # a phase as one round: each pass's flows carry its k - 1 steps' bytes, its steps the longest pass's
        rounds = []
        for phase in phases:
            flows = [(*ring_flows(axis), pass_fraction(axis, share) / shards) for axis, share in phase]
            rounds.append(Round(np.concatenate([a for a, _, _ in flows]), np.concatenate([b for _, b, _ in flows]),
                                np.concatenate([np.full(len(a), f) for a, _, f in flows]), 1,
                                max(box.shape[axis] - 1 for axis, _ in phase)))
    else:
        rounds = []
        for axis, share in passes(axes):
            a, b = ring_flows(axis)
            extent = box.shape[axis]
            rounds.append(Round(a, b, share / extent / 2, extent - 1))
    if op == "all_reduce":
        rounds = rounds + rounds[::-1]
    elif op == "all_gather":
        rounds = rounds[::-1]
    return rounds


def _even_over_nodes(hier: Hierarchy, group: np.ndarray) -> bool:
    counts = np.bincount(group // hier.per_node)
    counts = counts[counts > 0]
    return bool((counts == counts[0]).all())


def _node_grid(hier: Hierarchy, group: np.ndarray, algorithm: str) -> np.ndarray:
    """grid[node, local] = index into `group` of each rank, nodes in order; needs the same number of
    ranks on every node."""
    nodes = group // hier.per_node
    order = np.argsort(nodes, kind="stable")
    per_node = np.bincount(nodes)[np.unique(nodes)]
    if (per_node != per_node[0]).any():
        raise UserError(f"fabric.algorithm: {algorithm!r} needs the same number of ranks on every node; "
                        "use 'ring' or 'auto'")
    return order.reshape(len(per_node), int(per_node[0]))


def _hierarchical(op: str, hier: Hierarchy, group: np.ndarray) -> list[Round]:
    """Reduce-scatter inside each node, all-reduce across nodes rail by rail (ranks with the same local
    position), all-gather inside each node; needs the same number of ranks on every node."""
    grid = _node_grid(hier, group, "hierarchical")
    q, m = grid.shape
    intra_src, intra_dst = grid.ravel(), np.roll(grid, -1, axis=1).ravel()
    inter_src, inter_dst = grid.ravel(), np.roll(grid, -1, axis=0).ravel()
    rounds = []
    if m > 1:
        rounds.append(Round(intra_src, intra_dst, 1.0 / (m * 1.0), m - 1))
    if q > 1:
        steps = 2 * (q - 1) if op == "all_reduce" else q - 1
        rounds.append(Round(inter_src, inter_dst, 1.0 / (m * q), steps))
    if op == "all_reduce" and m > 1:
        rounds.append(Round(intra_src, intra_dst, 1.0 / m, m - 1))
    return rounds


def link_efficiency(topology: Topology) -> np.ndarray:
    """Achievable fraction of each link's bandwidth: NVLink-class measurements for the links of a
    scale-up domain (switch, full mesh, torus, mesh), NIC measurements for those of a scale-out network
    (fat tree, DragonFly, a hierarchy's network); `Topology.scale_up_links` says which is which."""
    return np.where(topology.scale_up_links(), assumed("scaleup_bw_efficiency", SCALEUP_BW_EFFICIENCY),
                    assumed("scaleout_bw_efficiency", SCALEOUT_BW_EFFICIENCY))


def _check_op(op: str) -> None:
    if op not in OPS:
        raise UserError(f"collective: unknown {quoted(op)}; use one of {', '.join(OPS)}")
