"""Routing requests across data-parallel replicas (`deployment.routing`).

- round_robin: request i to replica i mod R, decided up front (replicas then run independently,
  in parallel worker processes); under a concurrency cap, in send order, one client's cap over every
  replica (below).
- session_affinity: consistent by key: a request goes to the replica its session (in a workload of
  multi-turn sessions) or else its first prefix segment (a shared prompt's first block) hashes to, so
  one conversation or one system prompt always lands on the same replica; requests without either go
  round-robin. Also decided up front. Like vLLM production-stack's SessionRouter (a hash ring over the
  session key, src/vllm_router/routers/routing_logic.py) it counts nothing per replica: under a client's
  concurrency cap one replica can hold the whole cap, so such runs share one clock (below).
- least_outstanding: the replica with the fewest requests routed to it and not yet finished
  (SGLang router's shortest-queue; ties to the lowest index).
- least_kv_load: the replica whose KV cache is least used (vLLM's kv_cache_usage: blocks neither free
  nor holding an evictable prefix), ties by fewest outstanding.
- prefix_aware: SGLang router's cache_aware policy (sgl-project/sglang sgl-router/src/policies/
  cache_aware.rs at 026f853ba7ae08a457a2e127b85a26256a29e300, its defaults from the router's CLI):
  when the outstanding counts are imbalanced (max - min > 64 and max > 1.5 x min) the least
  outstanding replica; otherwise, if the best prefix match covers more than 30% of the prompt, the
  replica with that match, else the replica whose tree is smallest. As there, the match is against
  the router's own record of the prompts it sent to each replica (its approximate radix tree), not
  the replica's cache; unlike there, that record never evicts (the router's default max_tree_size,
  2^26 characters, is far beyond these runs).

The last three look at replicas as the request arrives, so every replica is simulated in one
process, stepped in time order (engine/cluster.py); so is round_robin over multi-turn sessions,
whose turns each wait for the one before, wherever it ran, and round_robin and session_affinity under a
concurrency cap, whose client sends as a request finishes on any replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from tokenpath.prefixes import Prefixes

Routing = Literal["round_robin", "least_outstanding", "least_kv_load", "prefix_aware", "session_affinity"]
ROUTINGS: tuple[str, ...] = ("round_robin", "least_outstanding", "least_kv_load", "prefix_aware", "session_affinity")
STATIC = ("round_robin", "session_affinity")  # decided before the run: replicas can be simulated apart

# SGLang router defaults (its CLI: cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5).
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


def static_assignment(policy: str, n: int, replicas: int, prefixes: Prefixes | None,
                      sessions: np.ndarray | None = None) -> np.ndarray:
    """The replica of each request under a routing decided up front (`sessions`: each request's session)."""
    assignment = np.arange(n, dtype=np.int64) % replicas
    if policy == "session_affinity" and sessions is not None:
        assignment = _hashed(sessions, replicas)
    elif policy == "session_affinity" and prefixes is not None:
        has = prefixes.offsets[1:] > prefixes.offsets[:-1]
        assignment[has] = _hashed(prefixes.keys[prefixes.offsets[:-1][has]], replicas)
    return assignment


def _hashed(keys: np.ndarray, replicas: int) -> np.ndarray:
    """Fibonacci hashing (the key times 2^64 / golden ratio, modulo 2^64), scaled to the replicas by
    its top bits, the well-mixed ones: keys that differ in any bits spread out."""
    mixed = (keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    return ((mixed * np.uint64(replicas)) >> np.uint64(32)).astype(np.int64)


class Router:
    """A load- or cache-aware policy's view of the replicas: what it sent where, and what is left."""

    def __init__(self, policy: str, replicas: int, prefixes: Prefixes | None,
                 assigned: np.ndarray | None = None) -> None:
        """`assigned`: each request's replica where the policy decided it up front (`static_assignment`)."""
        self.policy = policy
        self.assigned = assigned
        self.outstanding = [0] * replicas
        self.prefixes = prefixes
        self.sent_keys: list[set[int]] = [set() for _ in range(replicas)]  # the router's record per replica
        self.tree_tokens = [0] * replicas
        self.sends = 0  # requests routed so far (round_robin's turn)

    def choose(self, i: int, prompt_tokens: int, kv_used: Sequence[float]) -> int:
        replicas = range(len(self.outstanding))
        load = self.outstanding
        self.sends += 1
        if self.assigned is not None:
            return int(self.assigned[i])
        if self.policy == "round_robin":  # in send order (up front in runs without sessions: the same)
            return (self.sends - 1) % len(load)
        if self.policy == "least_outstanding":
            return min(replicas, key=load.__getitem__)
        if self.policy == "least_kv_load":
            return min(replicas, key=lambda r: (kv_used[r], load[r]))
        # prefix_aware
        keys, ends = self.prefixes.segments(i) if self.prefixes is not None else ([], [])
        if ends and ends[-1] > prompt_tokens:  # segments of the answer (a session's turn): not in the prompt
            within = sum(end <= prompt_tokens for end in ends)
            keys, ends = keys[:within], ends[:within]
        most, least = max(load), min(load)
        if most - least > BALANCE_ABS_THRESHOLD and most > least * BALANCE_REL_THRESHOLD:
            choice = min(replicas, key=load.__getitem__)
        else:
            best, matched = 0, 0
            for r in replicas:
                tokens = 0
                for key, end in zip(keys, ends):
                    if key not in self.sent_keys[r]:
                        break
                    tokens = end
                if tokens > matched:
                    best, matched = r, tokens
            if matched / prompt_tokens > CACHE_THRESHOLD:
                choice = best
            else:
                choice = min(replicas, key=self.tree_tokens.__getitem__)
        self._record(choice, keys, ends, prompt_tokens)
        return choice

    def _record(self, r: int, keys: list[int], ends: list[int], prompt_tokens: int) -> None:
        """The router's tree for replica r grows by the prompt's tokens it did not hold yet."""
        held, start = self.sent_keys[r], 0
        new = prompt_tokens - (ends[-1] if ends else 0)  # the request's own tokens are new
        for key, end in zip(keys, ends):
            if key not in held:
                held.add(key)
                new += end - start
            start = end
        self.tree_tokens[r] += new
