"""A collective's cost as the hand computations of the fabric tests check it."""

from __future__ import annotations

from tokenpath.fabric.collectives import AffineCost, Collectives


def wire(c: Collectives, op: str, groups: list[list[int]], algorithm: str | None = None) -> AffineCost:
    """The latency of the links' routes (NCCL's protocol LL, or the one protocol of an algorithm NCCL
    runs one way) with the busiest links' bandwidth (the protocol Simple): the two pieces a hand
    computation works out. Each protocol's own pair is checked in test_fabric_collectives.py."""
    costs = c.costs(op, groups, algorithm)
    return AffineCost(costs.get("LL", costs["Simple"]).alpha_s, costs["Simple"].beta_s_per_byte)
