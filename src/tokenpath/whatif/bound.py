"""An upper bound on a deployment's capacity at an SLO, from the step-cost model alone (no simulation):
the rate no run of that deployment can beat, so a search can skip a deployment whose bound is below
the best capacity it has found.

The workload's requests, averaged, give the work one request brings: its prompt tokens less the most
a prefix cache could hold, a logit per output token, and the attention pairs and KV reads of its
prompt and of each decode step. A step holding x requests' worth of that work takes t(x), the step
cost the engine charges (sim/deployment.py's GroupStepCosts: compute, host, collectives), with
every step taken as replaying a CUDA graph: an engine's kernel launches jump in above a step size,
and without them t is convex in the work (sums and maxima of linear terms, plus fixed costs per
step). Over any stretch of steady serving, the mean step time is then at least t of the mean step's
work x, so the requests served per second are at most x / t(x), which grows with x. (The collectives'
algorithm is the fastest at each size, a minimum that bends the other way; at the sizes one run's
steps span its effect is small.)

What caps x: the engine's limits (the token budget per step; one sequence per token of decode and
at least one per prompt, at most max_num_seqs; the contexts they read within the KV cache); and,
when the SLO bounds TPOT or ITL at any statistic, the mean step time, since a decoding sequence gets
one token a step, so its TPOT is the mean time of the steps it is in: x is at most where t(x)
reaches the tightest such target. With speculative decoding a decoding sequence runs its drafts and
one more token a step (and the drafter its passes) and gains the mean tokens a verify step accepts,
so a request takes that many times fewer steps, and its TPOT is the mean step time over those
tokens (its ITL still a step: a step's tokens reach the client as one event). Colocated replicas do
all of a request's work under that cap; disaggregated pools split it, prompts on the prefill replicas
(capped by their limits only) and decode steps on the others, and the pool that serves fewer requests
per second bounds the deployment.

It bounds a steady state. It assumes the targeted statistic of per-request TPOT (p99, p90, ...) is
at least the mean step time, which holds unless the steps' times vary much more within a run than
between requests; and a run too short to settle can meet the SLO above it (still filling when it
ends), so a search prunes with it only against a settled capacity. The search reports each bound
beside the capacity found, so a bound below a capacity would show.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tokenpath.engine.spec import MAX_STEP_TOKENS
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import Scenario
from tokenpath.sim.simulate import Prepared

# Bisection on the work per step stops when the bracket is this share of its upper end.
_BISECTION_SHARE = 1e-4


@dataclass(frozen=True)
class Work:
    """Work per request, in the step-cost model's terms (engine/replica.py's step arguments)."""

    tokens: float
    logits: float
    attn_pairs: float
    kv_read_tokens: float
    chunk_context_tokens: float
    sequences: float        # steps the request is in: each decode step, and at least one for its prompt

    def __add__(self, other: Work) -> Work:
        return Work(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[float, ...]:
        return (self.tokens, self.logits, self.attn_pairs, self.kv_read_tokens, self.chunk_context_tokens,
                self.sequences)


def request_work(prepared: Prepared) -> tuple[Work, Work]:
    """(prompt, decode) work of the workload's mean request. The prompt: its tokens less the most a
    prefix cache could hold (the prefix the request shares, up to all but one token), in one chunk;
    the decode: output - 1 steps, step k attending to the prompt and k tokens. Speculating, (output -
    1) / m verify steps of w query and LM-head rows each (w: the drafts and one more; m: the tokens a
    step gains on average, so that many steps are the fewest a request takes on average), each query
    attending to the context and the queries before it (engine/replica.py's verify step)."""
    requests, engine = prepared.requests, prepared.scenario.engine
    prompt = requests.input_tokens.astype(np.float64)
    out = requests.output_tokens.astype(np.float64)
    cached = np.zeros_like(prompt)
    if engine.prefix_caching and requests.prefixes is not None:
        cached = np.minimum(requests.prefixes.tokens.astype(np.float64), prompt - 1)
    q = prompt - cached
    speculation = prepared.deployment.costs.speculation
    width, gained = (1, 1.0) if speculation is None else (speculation.width, speculation.mean_tokens)
    steps = (out - 1) / gained
    contexts = steps * prompt + gained * steps * (steps - 1) / 2  # each step's context before its queries
    pairs = width * contexts + steps * width * (width + 1) / 2
    reads = contexts + steps * width
    prefill = Work(q.mean(), 1.0, (q * cached + q * (q + 1) / 2).mean(), prompt.mean(), cached.mean(), 1.0)
    decode = Work((width * steps).mean(), (width * steps).mean(), pairs.mean(), reads.mean(), 0.0, steps.mean())
    return prefill, decode


def _step_s(costs: Any, work: Work, x: float, scheduled: bool) -> float:
    """The engine's time for one step holding x requests' worth of `work` (speculating, the drafter's
    passes too, over the sequences that sample)."""
    tokens = max(1, round(x * work.tokens))
    logits = min(tokens, max(1, round(x * work.logits)))
    traffic_s = costs.traffic_s(tokens, logits == tokens)
    attn_pairs, kv_read, chunk_context = x * work.attn_pairs, x * work.kv_read_tokens, x * work.chunk_context_tokens
    if costs.speculation is None:
        return costs.compute_s(tokens, logits, attn_pairs, kv_read, chunk_context, scheduled, traffic_s) + traffic_s
    sequences = max(1, round(x * work.sequences))
    step_s = costs.compute_s(tokens, logits, attn_pairs, kv_read, chunk_context, scheduled, traffic_s, 0.0, None,
                             sequences) + traffic_s
    if costs.draft_s is not None:
        step_s += costs.draft_s(tokens, sequences, attn_pairs, kv_read, chunk_context)
    return step_s


def _per_engine(prepared: Prepared, work: Work, step_limit_s: float | None) -> float:
    """Requests/s one engine can at most serve doing `work` for each, with the mean step at most
    `step_limit_s` (None: no such cap)."""
    engine, deployment = prepared.deployment.engine, prepared.deployment
    costs = deployment.costs
    scheduled = engine.num_scheduler_steps == 1  # in a multi-step window only the first step schedules
    # A step's tokens within the budget, its sequences within max_num_seqs, and the positions they
    # read (each sequence's cached context, once) within the KV cache.
    high = min(engine.max_num_batched_tokens / work.tokens, engine.max_num_seqs / work.sequences,
               deployment.kv_capacity_tokens / work.kv_read_tokens)
    if step_limit_s is not None and _step_s(costs, work, high, scheduled) > step_limit_s:
        low = 0.0
        while high - low > _BISECTION_SHARE * high:
            middle = (low + high) / 2
            if _step_s(costs, work, middle, scheduled) <= step_limit_s:
                low = middle
            else:
                high = middle
        high = low
    if high <= 0:
        return 0.0
    return high / _step_s(costs, work, high, scheduled)


def _every_step_replayed(prepared: Prepared) -> Prepared:
    """The prepared deployment with every step replaying a CUDA graph (no kernel launches), its memory
    share the deployment's own: an engine whose default share reserves room for its graphs (SGLang's)
    would otherwise give graphs of every size the whole GPU."""
    scenario = prepared.scenario
    engine = scenario.engine.model_copy(update={"cuda_graphs": "all", "cuda_graph_max_tokens": MAX_STEP_TOKENS,
                                                "cuda_graph_padding": True,
                                                "gpu_memory_utilization": prepared.deployment.memory_share})
    replayed = scenario.model_copy(update={"engine": engine})
    return replace(prepared, scenario=replayed, deployment=build_deployment(replayed))


def capacity_bound_per_s(prepared: Prepared, step_limit_s: float | None) -> float:
    """The most requests/s the prepared deployment can serve with its mean step within
    `step_limit_s` (the tightest TPOT or ITL target; None: none)."""
    prefill, decode = request_work(prepared)
    prepared = _every_step_replayed(prepared)
    dep = prepared.scenario.deployment
    engines = prepared.deployment.replicas
    if not dep.prefill_replicas:
        return engines * _per_engine(prepared, prefill + decode, step_limit_s)
    prefills = dep.prefill_replicas
    rate = prefills * _per_engine(prepared, prefill, None)
    if decode.tokens:
        rate = min(rate, (engines - prefills) * _per_engine(prepared, decode, step_limit_s))
    return rate


def step_limit_s(slo: dict[str, Any], tokens_per_step: float = 1.0) -> float | None:
    """The longest mean step the tightest TPOT or ITL target of an SLO (capacity.Target by name, any
    statistic) allows; None: none. A TPOT target allows `tokens_per_step` times its limit (the tokens a
    decoding sequence gains a step: decode_tokens_per_step); an ITL target its limit (one event a step)."""
    limits = [target.limit * (tokens_per_step if name.startswith("tpot_") else 1.0)
              for name, target in slo.items() if name.startswith(("tpot_", "itl_"))]
    return min(limits) if limits else None


def decode_tokens_per_step(scenario: Scenario) -> float:
    """The tokens a decoding sequence gains a step on average: 1, or speculative decoding's mean."""
    speculative = scenario.engine.speculative
    if speculative is None:
        return 1.0
    return speculative.mean_tokens(scenario.workload.draft_acceptance)
