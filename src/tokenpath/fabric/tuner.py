"""NCCL's tuner, as the collectives take it: how it rates its protocols, and the ceilings and factors it puts
on its algorithms' bandwidth (src/graph/tuning.cc at NCCL 5067397: ncclTopoTuneModel, "Various model
refinements", and ncclTopoGetAlgoTime), in one place.

The tuner rates an algorithm under a protocol as a latency plus the bytes over a bus bandwidth: its graph's
channels times their speed (search.cc's nominal figure), then factors and ceilings. The model takes the
latencies (Protocol) and replaces the graph's nominal bandwidth by the bytes its flows put on the busiest
link at that link's achievable rate (collectives.py). What the tuner then states about achievable speed, it
applies to that physical bandwidth, in the tuner's order (Tuner.bandwidth_Bps):
- the protocols' share of the bandwidth (Protocol: LL's 8-byte flagged stores, LL128's 120 of 128 bytes);
- a tree all-reduce's 0.92, and the tree's measured shortfall at medium sizes (treeCorrectionFactor,
  applied to its time at each size: AffineCost.corrections), wherever the model runs NCCL's tree;
- across nodes, the ceilings it measured per channel (perChMax*Bws, the row of the nodes' GPU generation:
  Ampere, Hopper, Blackwell, by compute capability) and on LL (llMaxBws); the tree's 0.85
  where all of a tree channel's network traffic enters and leaves through one GPU, as on nodes with a NIC
  per GPU; and a Simple ring all-reduce's latency x1.4 ("plateau effect of ring").
The tuner's own nominal bandwidths (the graph's 48 GB/s a channel on 400G rails) are its alone: the model's
links stand in for them. `auto` then runs the fastest of these costs (collectives.fastest_s), as the tuner
runs the cheapest it rates.

Inside a node the per-channel ceilings sit above what the links carry (8 H100s: NCCL's search finds 6 ring
or tree channels of 60 GB/s and doubles them to 12 of 30, whose ceilings, 12 x 36.7 GB/s and more, pass the
graph's own 360), so the model applies none there; the LL ceiling there is indexed by the GPU's generation
(LL_MAX_BUS_BW_ONE_NODE_BPS: 141 GB/s of bus bandwidth on Hopper, under the 185 LL's half of 8 H100s' links
carries), and applies. Fat trees and DragonFlies have no nodes: there the Protocol table alone applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenpath.config.assumptions import assumed, default


@dataclass(frozen=True)
class Protocol:
    """One of the runtime's protocols for its ring and tree, as its tuner rates them (NCCL's, RCCL's
    src/graph/tuning.cc, ncclTopoTuneModel). Latency: the runtime's base latency (collectives.BASE_LATENCY_S,
    RCCL_BASE_LATENCY_S) plus `base_extra_s` (the ring's, the tree's), and per step the route's links, each
    at its own latency (the ring's LL: NCCL's hwLatencies NVLINK 0.6 us a hop, RCCL's xGMI 0.8, NET 2.7 us a
    route) times the step ratio of its kind (scale-up, network). Across nodes a step inside a node and a step
    between nodes each take their own (Round.inter_steps), and a ring's step inside a node takes at least
    NET_OVERHEAD_S times `net_overhead_factor`. Bandwidth: `ring_bandwidth` or `tree_bandwidth` (inside one
    node, over 2 nodes, over more: the tuner's N1, N2, N4) of the links' achievable bandwidth; a share of 0:
    the runtime does not run it there."""

    name: str
    base_extra_s: tuple[float, float]
    ring_step_ratio: tuple[float, float]
    tree_step_ratio: tuple[float, float]
    ring_bandwidth: float
    tree_bandwidth: tuple[float, float, float]
    net_overhead_factor: float


# tuning.cc baseLatencies Ring {LL 6.6, LL128 14.0, Simple 8.4} us, Tree {6.8, 14.0, 8.4}; hwLatencies
# NVLINK Ring {0.6, 1.9, 3.4}, Tree {0.6, 1.25, 4.0}, NET Ring {2.7, 4.0, 14.0}, Tree {5.0, 8.5, 14.0} us;
# busBw: Ring LL x 0.5, LL128 x 0.92 (120 of 128 bytes), Tree LL x 1/3.8, LL128 x 7/9 in a node, 120/128
# across nodes. A link's latency is the ring's LL step over it, so every ratio is over those: a tree's
# network step under LL takes 5.0 / 2.7 of it. A ring's net overhead counts x3 under Simple.
PROTOCOLS = (
    Protocol("LL", (0.0, 6.8e-6 - 6.6e-6), (1.0, 1.0), (1.0, 5.0 / 2.7), 0.5, (1 / 3.8,) * 3, 1.0),
    Protocol("LL128", (14.0e-6 - 6.6e-6,) * 2, (1.9 / 0.6, 4.0 / 2.7), (1.25 / 0.6, 8.5 / 2.7), 0.92,
             (7 / 9, 120 / 128, 120 / 128), 1.0),
    Protocol("Simple", (8.4e-6 - 6.6e-6,) * 2, (3.4 / 0.6, 14.0 / 2.7), (4.0 / 0.6, 14.0 / 2.7), 1.0,
             (1.0,) * 3, 3.0),
)
SIMPLE = PROTOCOLS[-1]
# RCCL, on AMD's GPUs, rates its protocols from tables of its own (ROCm/rccl src/graph/tuning.cc at 0cbce2a,
# rocm-6.2/6.3; the LL and Simple figures are the same in its 2025 tuning.cc): the HIP build compiles out every
# refinement of NCCL's above and below (the 0.5, 0.92, 1/3.8 shares, the per-channel and LL ceilings, the tree's
# 0.92 and 0.85 and correction, the ring's plateau: `#if defined(__HIP_PLATFORM_AMD__)` takes its bwRatio
# instead). Each platform RCCL recognises names one of its tuning models (src/graph/rome_models.cc
# `tuning=`): the 8-GPU xGMI platforms of the CDNA3 chips (MI300X, MI325X: gfx942; rome_model_79 with no NICs,
# _81 with 8, _84 with 16) take tuning_model_5. The generations RCCL runs on, by the model of theirs.
RCCL_TUNING_MODELS = {"CDNA3": 5}
# tuning_model_5: baseLat Ring and Tree {LL 12.0, LL128 12.0, Simple 17.0} us (collectives.RCCL_BASE_LATENCY_S:
# the LL's); hwLat NVLINK (xGMI) Ring {0.8, -, 2.1}, Tree {0.9, -, 2.3} us, over the ring's LL step (xGMI's
# hop, build.XGMI_HOP_LATENCY_S); bwRatio Ring {LL 0.08, Simple 1.00} over 2 nodes and more, Tree {0.06, 0.11}
# over 2 nodes, {0.06, 0.59} over more, which the HIP build applies inside one node too (nNodes <= 2); and on
# gfx94x (`IsArchMatch(..., "gfx94")`) no Tree under Simple inside one node. No LL128: RCCL enables it only
# where the platform's model sets ll128Enabled (or RCCL_LL128_FORCE_ENABLE), which none of gfx942's does.
# What the model does not take of RCCL's: its NET hwLat (Ring Simple 320 us a step, Tree 25) and its ring and
# tree correction factors by size (tenths, 0.1 at most sizes): across nodes RCCL sets the protocol by size
# (rccl_wrap.cc rcclUpdateCollectiveProtocol, the tuning model's llProtoRanges), so these weigh its choice
# rather than rate a time; the network steps keep NCCL's ratios over the links' latency.
RCCL_PROTOCOLS = (
    Protocol("LL", (0.0, 0.0), (1.0, 1.0), (0.9 / 0.8, 5.0 / 2.7), 0.08, (0.06,) * 3, 1.0),
    Protocol("Simple", (17.0e-6 - 12.0e-6,) * 2, (2.1 / 0.8, 14.0 / 2.7), (2.3 / 0.8, 14.0 / 2.7), 1.0,
             (0.0, 0.11, 0.59), 3.0),
)


def runs_rccl(generation: str | None) -> bool:
    """Whether the chips of `generation` (catalog/chips.toml) run their collectives on RCCL: those
    RCCL_TUNING_MODELS has a model for; NCCL (or its figures) the rest."""
    return generation in RCCL_TUNING_MODELS


# The algorithms NCCL runs under every protocol, and the tuner's rows that price each: the hierarchical
# path is ring steps inside the nodes and across them. The others run one way (NVLS and NVLSTree: Simple).
PROTOCOL_ALGORITHMS = {"ring": "ring", "hierarchical": "ring", "tree": "tree"}

# A tree all-reduce's bus bandwidth is 0.92 of its graph's (tuning.cc: `busBw = std::min(busBw * .92,
# nChannels * perChMaxTreeBw)`, inside a node and across nodes): NCCL's tree kernel reduces and broadcasts
# in one pipeline and reaches that share of what its links carry.
TREE_ALL_REDUCE_EFFICIENCY = default("tree_all_reduce_efficiency")
# A tree whose channels send and receive all their network traffic through one GPU reaches 0.85 of that
# (tuning.cc: `if (a == NCCL_ALGO_TREE && comm->maxTreePattern == NCCL_TOPO_PATTERN_TREE) busBw *= .85`;
# graph.h: PATTERN_TREE, "All NIC traffic going to/from the same GPU"). On nodes with a NIC per GPU the
# search ends there: its balanced tree (pattern 1) sends half of a channel's traffic to the NIC from a second
# GPU, which reaches that NIC only through the first (search.cc ncclTopoSearchRecGpu, ncclTopoSearchCheckNet),
# so ncclTopoCompute falls back to the "simpler tree" (pattern 3) before it widens the path types.
TREE_SAME_GPU_NIC_EFFICIENCY = default("tree_same_gpu_nic_efficiency")
# A Simple ring all-reduce across nodes takes 1.4 times its steps' latency once a channel's share of a rank's
# buffer reaches 64 bytes (tuning.cc ncclTopoGetAlgoTime, "Plateau effect of ring", compute capability 8.0
# and later; 1.9 before): taken at every size, since below that LL is the faster by far.
RING_SIMPLE_LATENCY_PLATEAU = default("ring_simple_latency_plateau")
# The most bus bandwidth LL reaches across nodes, set by the CPU (tuning.cc llMaxBws, indexed by CPU vendor
# across nodes: Intel and any CPU but AMD 39.0 GB/s over 2 nodes, 20.4 over more; AMD 22.5 and 19.0), for the
# ring and the tree alike. The Intel row, as NET_OVERHEAD_S takes its CPU's net overhead.
LL_MAX_BUS_BW_TWO_NODES_BPS = default("ll_max_bus_bw_two_nodes_Bps")
LL_MAX_BUS_BW_MORE_NODES_BPS = default("ll_max_bus_bw_more_nodes_Bps")
# Inside one node the LL ceiling is indexed by the GPU's generation instead (tuning.cc: "for single node, we
# look at GPU type", llMaxBws[compCapIndex][0]: Volta 39.0, Ampere 87.7, Hopper 141.0, Blackwell 2 x 141.0 GB/s
# of bus bandwidth), for the ring and the tree alike.
LL_MAX_BUS_BW_ONE_NODE_BPS = {"Ampere": 87.7e9, "Hopper": 141.0e9, "Blackwell": 282.0e9}
# The GPU generations whose rows NCCL's tuner tables hold, by the compute capability that picks the row
# (tuning.cc ncclTopoTuneModel: compCapIndex Blackwell from 10.0, Hopper from 9.0, Ampere from 8.0, Volta
# below; nccl_tuner.h NCCL_*_COMPCAP_IDX): a chip's generation is catalog/chips.toml's (A100 Ampere, H100 and
# H200 Hopper, B200 and GB200 Blackwell). No chip of the catalog is a Volta. A generation not here (AMD's,
# Google's, Intel's chips, which NCCL does not run on) takes none of the rows.
NCCL_COMPUTE_CAPABILITY = {"Ampere": 80, "Hopper": 90, "Blackwell": 100}
# The most bus bandwidth a channel reaches, by GPU generation, over 2 nodes and over more (tuning.cc
# perChMaxTreeBws, perChMaxTreeLL128Bws, perChMaxRingLL128Bws, perChMaxNVLSTreeBws; GB/s), as
# (algorithm, protocol) -> (2 nodes, more). The tree's Simple ceiling holds under every protocol, before the
# protocol's own (the tuner applies it first). (Ampere's NVLSTree row never runs: its switches have no NVLS.)
PER_CHANNEL_MAX_BUS_BW_BPS = {
    "Ampere": {("tree", "any"): (23.6e9, 17.8e9), ("tree", "LL128"): (20.0e9, 20.0e9),
               ("ring", "LL128"): (20.0e9, 20.0e9), ("nvls_tree", "Simple"): (23.6e9, 17.8e9)},
    "Hopper": {("tree", "any"): (41.4e9, 36.0e9), ("tree", "LL128"): (36.7e9, 29.0e9),
               ("ring", "LL128"): (36.7e9, 36.7e9), ("nvls_tree", "Simple"): (57.7e9, 45.5e9)},
    "Blackwell": {("tree", "any"): (42.8e9, 24.0e9), ("tree", "LL128"): (31.67e9, 20.0e9),
                  ("ring", "LL128"): (40.0e9, 40.0e9), ("nvls_tree", "Simple"): (96.0e9, 80.0e9)},
}
# The bandwidths NCCL's search tries for a channel that crosses the network, fastest first, by the compute
# capability it searches for (search.cc speedArrayInter, sm90SpeedArrayInter, sm100SpeedArrayInter; GB/s): a
# channel over one NIC runs at the fastest its NIC carries (400G, 50 GB/s: 48; 200G, 25 GB/s: 24; 800G: 96
# from 10.0).
NET_CHANNEL_SPEEDS_GBPS = {
    80: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    90: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    100: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2,
          0.24, 0.12),
}
# ncclTopoDupChannels (search.cc) doubles a graph's channels, each at half the bandwidth, where they run at 25
# GB/s or more, except past compute capability 8.0 where more than four run at under 50 GB/s:
# (the least channel speed it doubles, GB/s; the speed under which more than `most` are kept past 8.0).
DUP_CHANNELS_GBPS = (25.0, 50.0, 4)
# "Trees are not perfectly sticking to the model for medium sizes": tuning.cc treeCorrectionFactor, the share
# of its bandwidth a tree all-reduce reaches at each size, indexed by log2(bytes / 64), 64 B to 256 MiB
# (ncclTopoGetAlgoTime applies the first 23 to the tree; NVLSTree takes all 24 on Blackwell with x86 CPUs).
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}


def correction(corrections: tuple[float, ...], size_bytes: float) -> float:
    """The share of its bandwidth a tree reaches at `size_bytes` (tuning.cc: logSize = log2i(nBytes >> 6),
    the factor where 0 <= logSize < len(corrections), else 1)."""
    index = _log_size(size_bytes)
    return corrections[index] if 0 <= index < len(corrections) else 1.0


def corrected_bytes(corrections: tuple[float, ...], size_bytes: float) -> float:
    """The bytes a tree's bandwidth term takes `size_bytes` as: over the share of its bandwidth it reaches
    there, NCCL's (`correction`) at each power of two and, between two, the line from one's to the next's in
    log2 of the size. NCCL reads its table by steps (the share of the power of two below), where the tuner
    only compares algorithms by it; timed by steps, a 4 MiB all-reduce under LL128 (0.8) was 15% faster
    than one a byte smaller (0.6). Along the line a larger message never takes less time while the share
    rises by less than ln 2 of itself a doubling: the tables' steepest rise is 0.6 to 0.8, under 0.42."""
    index = _log_size(size_bytes)
    if index < 0:
        return float(size_bytes)
    low = 64 << index
    step = math.log2(size_bytes / low)
    share = correction(corrections, low) * (1 - step) + correction(corrections, 2 * low) * step
    return size_bytes / share


def _log_size(size_bytes: float) -> int:
    """tuning.cc's logSize: log2 of the message's 64-byte chunks (-1 under one chunk)."""
    return (int(size_bytes) >> 6).bit_length() - 1


@dataclass(frozen=True)
class Span:
    """A group as NCCL's tuner sees it: `nodes`, `ranks`, `rails` (the NICs each node gives it: its ranks on
    the node with the fewest, each with its own NIC of `nic_Bps` a direction; none inside one node) and the
    nodes' GPU `generation` (one of NCCL_COMPUTE_CAPABILITY's)."""

    nodes: int
    ranks: int
    rails: int
    generation: str
    nic_Bps: float

    def channels(self, algorithm: str) -> int:
        """Its graph's channels (search.cc ncclTopoCompute): the ring's and the tree's one per rail, each at
        the fastest of NET_CHANNEL_SPEEDS_GBPS its NIC carries, doubled as ncclTopoDupChannels doubles them
        (DUP_CHANNELS_GBPS: on 400G rails past 8.0, 48 GB/s, where they are four or fewer; on an A100's 200G
        rails, 24 GB/s, never); NVLSTree's one per rank of a node (ncclTopoSearchTryNvls: every GPU a head;
        never doubled)."""
        if algorithm == "nvls_tree":
            return self.rails
        capability = NCCL_COMPUTE_CAPABILITY[self.generation]
        speeds = NET_CHANNEL_SPEEDS_GBPS[capability]
        speed = next((s for s in speeds if s <= self.nic_Bps / 1e9), speeds[-1])
        least, fast, most = DUP_CHANNELS_GBPS
        if speed < least or (capability > 80 and speed < fast and self.rails > most):
            return self.rails
        return 2 * self.rails


class Tuner:
    """The runtime's tuner for chips of `generation` (catalog/chips.toml): RCCL's for those of
    RCCL_TUNING_MODELS, NCCL's for the rest (its rows by generation only where NCCL_COMPUTE_CAPABILITY has
    one; chips neither runs on take NCCL's generation-free figures); with a run's assumptions read once (as
    Collectives reads its own)."""

    def __init__(self, generation: str = "") -> None:
        self.rccl = runs_rccl(generation)
        self.protocols = RCCL_PROTOCOLS if self.rccl else PROTOCOLS
        self.tree_all_reduce_efficiency = assumed("tree_all_reduce_efficiency", TREE_ALL_REDUCE_EFFICIENCY)
        self.tree_same_gpu_nic_efficiency = assumed("tree_same_gpu_nic_efficiency", TREE_SAME_GPU_NIC_EFFICIENCY)
        self.ring_simple_latency_plateau = assumed("ring_simple_latency_plateau", RING_SIMPLE_LATENCY_PLATEAU)
        self.ll_max_bus_bw_Bps = (assumed("ll_max_bus_bw_two_nodes_Bps", LL_MAX_BUS_BW_TWO_NODES_BPS),
                                  assumed("ll_max_bus_bw_more_nodes_Bps", LL_MAX_BUS_BW_MORE_NODES_BPS))

    def runs(self, algorithm: str, protocol: Protocol, nodes: int) -> bool:
        """Whether the runtime runs `algorithm` under `protocol` over `nodes` nodes (its share there is not 0)."""
        return self._share(algorithm, protocol, nodes) > 0

    def bandwidth_Bps(self, algorithm: str, op: str, protocol: Protocol, links_Bps: float, nodes: int,
                      span: Span | None) -> float:
        """The bandwidth (bytes of the message a second) `algorithm` reaches under `protocol` where its flows'
        busiest link allows `links_Bps`: `nodes`, the tuner's nNodes (1 inside a scale-up domain; it picks the
        protocol's share); `span`, the group where the model knows its GPUs' generation (a scale-up domain's, a
        hierarchy's nodes'), for the ceilings. In the tuner's order: a tree all-reduce's 0.92, the tree's
        ceiling per channel, the protocol's share, its ceilings (LL; LL128 per channel), a tree's 0.85 for its
        pattern. Inside one node only the LL ceiling applies (LL_MAX_BUS_BW_ONE_NODE_BPS). RCCL: the share
        alone."""
        if self.rccl:
            return links_Bps * self._share(algorithm, protocol, nodes)
        across = span is not None and span.nodes > 1
        if algorithm == "nvls_tree":
            return min(links_Bps, self._ceiling_Bps(algorithm, "Simple", op, span)) if across else links_Bps
        if algorithm == "tree":
            bw = links_Bps * self.tree_all_reduce_efficiency
            if across:
                bw = min(bw, self._ceiling_Bps("tree", "any", op, span))
            bw *= self._share(algorithm, protocol, nodes)
        else:
            bw = links_Bps * self._share(algorithm, protocol, nodes)
        if span is None:
            return bw
        if not across:
            if protocol.name != "LL":
                return bw
            return min(bw, LL_MAX_BUS_BW_ONE_NODE_BPS[span.generation] * self._algorithm_share(algorithm, op,
                                                                                               span.ranks))
        if protocol.name == "LL":
            bw = min(bw, self.ll_max_bus_bw_Bps[span.nodes > 2] * self._algorithm_share(algorithm, op, span.ranks))
        elif protocol.name == "LL128":
            bw = min(bw, self._ceiling_Bps(algorithm, "LL128", op, span))
        return bw * self.tree_same_gpu_nic_efficiency if algorithm == "tree" else bw

    def latency_factor(self, algorithm: str, op: str, protocol: Protocol, span: Span | None) -> float:
        """What the tuner multiplies a latency by: RING_SIMPLE_LATENCY_PLATEAU for a Simple ring all-reduce
        across nodes under NCCL, else 1."""
        if self.rccl:
            return 1.0
        across = span is not None and span.nodes > 1
        plateau = across and algorithm == "ring" and op == "all_reduce" and protocol.name == "Simple"
        return self.ring_simple_latency_plateau if plateau else 1.0

    def corrections(self, algorithm: str, protocol: Protocol, span: Span | None) -> tuple[float, ...]:
        """The shares of its bandwidth `algorithm` reaches by size (AffineCost.corrections), as NCCL's
        ncclTopoGetAlgoTime takes them: the tree all-reduce's first 23 (to 256 MiB), NVLSTree's 24 on
        Blackwell (with x86 CPUs, as the model's CPU figures assume); none for the rest, nor under RCCL
        (RCCL_PROTOCOLS: its own factors weigh its choice)."""
        if self.rccl:
            return ()
        if algorithm == "tree":
            return TREE_CORRECTION[protocol.name][:23]
        if algorithm == "nvls_tree" and span is not None and span.nodes > 1 and span.generation == "Blackwell":
            return TREE_CORRECTION[protocol.name]
        return ()

    @staticmethod
    def _share(algorithm: str, protocol: Protocol, nodes: int) -> float:
        """The protocol's share of the links for `algorithm` over `nodes` nodes (the tuner's N1, N2, N4)."""
        if algorithm == "tree":
            return protocol.tree_bandwidth[min(nodes, 3) - 1]
        return protocol.ring_bandwidth

    def _ceiling_Bps(self, algorithm: str, protocol: str, op: str, span: Span) -> float:
        """A per-channel ceiling on bus bandwidth times the channels, as bandwidth of the message."""
        per_channel_Bps = PER_CHANNEL_MAX_BUS_BW_BPS[span.generation][algorithm, protocol][span.nodes > 2]
        return span.channels(algorithm) * per_channel_Bps * self._algorithm_share(algorithm, op, span.ranks)

    @staticmethod
    def _algorithm_share(algorithm: str, op: str, ranks: int) -> float:
        """The tuner's bus to algorithm bandwidth (tuning.cc, "Convert bus BW to algorithm BW"): a tree's
        is half its bus bandwidth; a ring's and NVLSTree's nRanks / nsteps."""
        if algorithm == "tree":
            return 0.5
        steps = 2 * (ranks - 1) if op == "all_reduce" else ranks - 1
        return ranks / steps

