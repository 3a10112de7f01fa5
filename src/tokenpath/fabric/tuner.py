"""NCCL's tuner, as the collectives take it: how it rates its protocols (src/graph/tuning.cc at NCCL 5067397,
ncclTopoTuneModel), in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Protocol:
    """One of NCCL's protocols for its ring and tree, as its tuner rates them (src/graph/tuning.cc,
    ncclTopoTuneModel). Latency: BASE_LATENCY_S plus `base_extra_s` (the ring's, the tree's), and per step
    the route's links, each at its own latency (the ring's LL: tuning.cc hwLatencies NVLINK 0.6 us a hop,
    NET 2.7 us a route) times the step ratio of its kind (NVLink-class, network). Across nodes a step
    inside a node and a step between nodes each take their own (Round.inter_steps), and a ring's step inside
    a node takes at least NET_OVERHEAD_S times `net_overhead_factor`. Bandwidth: `ring_bandwidth` or
    `tree_bandwidth` (inside one node, across nodes) of the links' achievable bandwidth."""

    name: str
    base_extra_s: tuple[float, float]
    ring_step_ratio: tuple[float, float]
    tree_step_ratio: tuple[float, float]
    ring_bandwidth: float
    tree_bandwidth: tuple[float, float]
    net_overhead_factor: float


# tuning.cc baseLatencies Ring {LL 6.6, LL128 14.0, Simple 8.4} us, Tree {6.8, 14.0, 8.4}; hwLatencies
# NVLINK Ring {0.6, 1.9, 3.4}, Tree {0.6, 1.25, 4.0}, NET Ring {2.7, 4.0, 14.0}, Tree {5.0, 8.5, 14.0} us;
# busBw: Ring LL x 0.5, LL128 x 0.92 (120 of 128 bytes), Tree LL x 1/3.8, LL128 x 7/9 in a node, 120/128
# across nodes. A link's latency is the ring's LL step over it, so every ratio is over those: a tree's
# network step under LL takes 5.0 / 2.7 of it. A ring's net overhead counts x3 under Simple.
PROTOCOLS = (
    Protocol("LL", (0.0, 6.8e-6 - 6.6e-6), (1.0, 1.0), (1.0, 5.0 / 2.7), 0.5, (1 / 3.8, 1 / 3.8), 1.0),
    Protocol("LL128", (14.0e-6 - 6.6e-6,) * 2, (1.9 / 0.6, 4.0 / 2.7), (1.25 / 0.6, 8.5 / 2.7), 0.92,
             (7 / 9, 120 / 128), 1.0),
    Protocol("Simple", (8.4e-6 - 6.6e-6,) * 2, (3.4 / 0.6, 14.0 / 2.7), (4.0 / 0.6, 14.0 / 2.7), 1.0, (1.0, 1.0),
             3.0),
)
# The algorithms NCCL runs under every protocol, and the tuner's rows that price each: the hierarchical
# path is ring steps inside the nodes and across them. The others run one way (NVLS and NVLSTree: Simple).
PROTOCOL_ALGORITHMS = {"ring": "ring", "hierarchical": "ring", "tree": "tree"}
