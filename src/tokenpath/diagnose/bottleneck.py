"""Which layer holds most of a request's time, and why, in one line."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpath.summary import LAYER_OF_PART


@dataclass(frozen=True)
class Evidence:
    """Facts from a simulation that explain each layer's share."""

    offered_rate_per_s: float
    served_rate_per_s: float
    busy_fraction: float           # share of the window the engine was running steps
    mean_batch_seqs: float
    preemptions: int
    memory_bound_fraction: float   # share of compute time in memory-bound ops, at a typical step
    allreduces_per_step: int
    tp: int
    network_rtt_s: float
    detokenize: str
    host_share_of_step: float      # share of step time the host blocked the device


def bottleneck(attribution_s: dict[str, float], evidence: Evidence) -> tuple[str, str]:
    """(layer, reason) for the largest mean part of E2E."""
    total = sum(attribution_s.values()) or 1.0
    part = max(attribution_s, key=attribution_s.get)
    share = attribution_s[part] / total
    e = evidence
    if part == "queue":
        why = (f"requests wait {share:.0%} of E2E for a batch slot: the engine was busy {e.busy_fraction:.0%} of the "
               f"time at {e.offered_rate_per_s:.3g} req/s offered, {e.preemptions} preemptions")
    elif part == "compute":
        bound = "HBM-bandwidth" if e.memory_bound_fraction >= 0.5 else "FLOP"
        why = (f"{share:.0%} of E2E is engine compute at a mean batch of {e.mean_batch_seqs:.0f} sequences; "
               f"{e.memory_bound_fraction:.0%} of a typical step is memory-bound, so steps are {bound}-bound")
    elif part == "traffic":
        why = (f"{share:.0%} of E2E is tensor-parallel traffic: {e.allreduces_per_step} all-reduces per step "
               f"across {e.tp} chips")
    else:
        why = (f"{share:.0%} of E2E is the last mile: a {e.network_rtt_s * 1e3:.3g} ms client round trip, and "
               f"{e.detokenize} detokenization blocking {e.host_share_of_step:.0%} of each step")
    return LAYER_OF_PART[part], why


def typical_step(tokens: np.ndarray, kv_read_tokens: np.ndarray, seqs: np.ndarray) -> tuple[int, int, float]:
    """The median step by tokens processed: (num_tokens, num_seqs, kv_read_tokens)."""
    order = np.argsort(tokens, kind="stable")
    middle = order[len(order) // 2]
    return int(tokens[middle]), int(seqs[middle]), float(kv_read_tokens[middle])
