"""Which layer holds most of a request's time, and why, in one line."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath.compute.roofline import ComputeModel
from tokenpath.summary import LAYER_OF_PART
from tokenpath.units import format_number


@dataclass(frozen=True)
class Evidence:
    """Facts from a simulation that explain each layer's share."""

    offered_rate_per_s: float
    busy_fraction: float           # share of the window the engine was running steps
    mean_batch_seqs: float
    preemptions: int
    memory_bound_fraction: float   # share of compute time in memory-bound ops
    traffic_detail: str            # what the fabric carries each step, e.g. "160 TP all-reduces over 8 chips"
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
               f"time at {format_number(e.offered_rate_per_s)} req/s offered, {e.preemptions} preemptions")
    elif part == "compute":
        bound = "HBM-bandwidth" if e.memory_bound_fraction >= 0.5 else "FLOP"
        why = (f"{share:.0%} of E2E is engine compute at a mean batch of {e.mean_batch_seqs:.0f} sequences; "
               f"{e.memory_bound_fraction:.0%} of compute time is in memory-bound ops, so steps are {bound}-bound")
    elif part == "traffic":
        why = f"{share:.0%} of E2E is fabric traffic: {e.traffic_detail}"
    else:
        why = (f"{share:.0%} of E2E is the last mile: a {format_number(e.network_rtt_s * 1e3)} ms client round trip, and "
               f"{e.detokenize} detokenization blocking {e.host_share_of_step:.0%} of each step")
    return LAYER_OF_PART[part], why


def sample_steps(num_steps: int, samples: int = 200) -> range:
    """Up to `samples` evenly spaced step indices."""
    return range(0, num_steps, max(1, num_steps // samples))


def memory_bound_share(compute: ComputeModel, steps: list[tuple[int, int, int, int]]) -> float:
    """Share of compute time spent in memory-bound ops over the given steps.

    `steps` rows are (num_tokens, num_logits, attn_pairs, kv_read_tokens); each step's ops are
    weighted by their own roofline times, so long steps count for more.
    """
    memory_s = total_s = 0.0
    for tokens, logits, pairs, kv_read in steps:
        for op in compute.step_ops(int(tokens), int(logits), int(pairs), int(kv_read)):
            total_s += op.time_s
            memory_s += op.time_s if op.bound == "memory" else 0.0
    return memory_s / total_s if total_s else 0.0
