"""Every deployment of a scenario's model on N chips that `tokenpath search` compares: how the chips
split (tensor x pipeline x data parallel, prefill and decode pools, experts over each replica's chips, their
tokens gathered or sent by DeepEP's all-to-alls, attention data-parallel over the tensor-parallel group), which
engine profile runs them, and its batching limits; each a set of dotted-key overrides.

Enumeration lists every split whose group divides the chips; whether a split is possible is left to
the project's own checks (sim/deployment.py: heads, layers, memory), run on each candidate's scenario.
The one rule added here: a tensor-parallel group stays inside one scale-up domain (an NVLink node),
since its two all-reduces per layer would otherwise cross the scale-out network.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tokenpath.config.errors import UserError, quoted
from tokenpath.engine.profiles import MEASURED_ENGINES, PROFILES, listed
from tokenpath.fabric.spec import HierarchyFabric
from tokenpath.sim.deployment import simulated_fabric
from tokenpath.sim.scenario import Scenario
from tokenpath.whatif.catalog import padded_graphs
from tokenpath.whatif.run import Base

# The batching limits tried around an engine's own (max_num_seqs, max_num_batched_tokens): each
# halved and doubled, every pair of the three values of each (the base and 8 variants), refused
# by the engine spec where the token budget falls below the sequences.
LIMIT_FACTORS = (1.0, 0.5, 2.0)


@dataclass(frozen=True)
class Candidate:
    """One deployment of the search: a split of `chips`, an engine profile and its limits."""

    chips: int
    tp: int
    pp: int
    scheduler: str
    max_num_seqs: int | None  # None: the engine's own for the deployment (Profile.running_from_kv, SGLang's)
    max_num_batched_tokens: int
    prefill_replicas: int = 0
    expert_parallel: bool = False
    attention_dp: bool = False
    moe_all_to_all: bool = False  # with expert_parallel: DeepEP's all-to-alls carry the experts' tokens
    # How the search launches the engine where the scenario leaves it unset (launch_tuning): chunked prefill
    # (None: the scenario's own, or its profile's default), and every decode batch up to max_num_seqs
    # replayed as a graph, padded (False: the scenario's graphs).
    chunked_prefill: bool | None = None
    padded_graphs: bool = False

    @property
    def replicas(self) -> int:
        return self.chips // (self.tp * self.pp)

    @property
    def layout(self) -> str:
        """E.g. `TP2 x DP4`, `TP2 x PP2 x DP2`, `TP2 x DP4 (1P:3D)`, `TP8 x DP1 + EP + DP-attention`,
        `TP8 x DP1 + EP (all-to-all)`."""
        parts = [f"TP{self.tp}", *([f"PP{self.pp}"] if self.pp > 1 else []), f"DP{self.replicas}"]
        text = " x ".join(parts)
        if self.prefill_replicas:
            text += f" ({self.prefill_replicas}P:{self.replicas - self.prefill_replicas}D)"
        experts = " + EP (all-to-all)" if self.moe_all_to_all else " + EP" if self.expert_parallel else ""
        return text + experts + (" + DP-attention" if self.attention_dp else "")

    @property
    def limits(self) -> str:
        return f"{self.seqs} seqs, {self.max_num_batched_tokens} tokens"

    @property
    def seqs(self) -> str:
        """max_num_seqs as a table shows it: a number, or `own` where the engine sets it."""
        return "own" if self.max_num_seqs is None else str(self.max_num_seqs)

    def overrides(self) -> dict[str, Any]:
        """The scenario keys that make this deployment (`--set KEY=VALUE` each)."""
        return {"deployment.chips": self.chips, "deployment.tp": self.tp, "deployment.pp": self.pp,
                "deployment.prefill_replicas": self.prefill_replicas,
                "deployment.expert_parallel": self.expert_parallel, "deployment.moe_all_to_all": self.moe_all_to_all,
                "deployment.attention_dp": self.attention_dp,
                "engine.scheduler": self.scheduler,
                **({} if self.max_num_seqs is None else {"engine.max_num_seqs": self.max_num_seqs}),
                "engine.max_num_batched_tokens": self.max_num_batched_tokens,
                **({} if self.chunked_prefill is None else {"engine.chunked_prefill": self.chunked_prefill}),
                **(padded_graphs(self.max_num_seqs) if self.padded_graphs else {})}


def parse_engines(text: str | None, default: str) -> list[str]:
    """`vllm-v1,sglang` -> the profiles named (a profile's name, or its engine's as the latency rows
    name it: sglang is prefill-first); None: [default], the scenario's own."""
    if text is None:
        return [default]
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    if not names:
        raise UserError(f"--engines: give engine profiles separated by commas, e.g. {','.join(list(PROFILES)[:2])}")
    for name in names:
        if name not in PROFILES and name not in MEASURED_ENGINES:
            known = [*PROFILES, *(f"{alias} (= {profile})" for alias, profile in MEASURED_ENGINES.items()
                                  if alias not in PROFILES)]
            raise UserError(f"--engines: unknown engine {quoted(name)}; use {listed(known)}")
    return list(dict.fromkeys(name if name in PROFILES else MEASURED_ENGINES[name] for name in names))


def scaleup_domain(scenario: Scenario) -> int:
    """Chips one scale-up domain joins in the fabric the scenario runs on: a hierarchy's node, or the
    whole fabric when it has one level."""
    fabric = simulated_fabric(scenario)[0]
    chips = scenario.deployment.chips
    if isinstance(fabric, HierarchyFabric):
        return fabric.chips_per_node or -(-chips // fabric.nodes)
    return chips


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def splits(chips: int, moe: bool, disaggregated: bool) -> list[tuple[int, int, int, bool, bool, bool]]:
    """Every (tp, pp, prefill_replicas, expert_parallel, moe_all_to_all, attention_dp) with tp x pp dividing
    `chips`; with `disaggregated`, also each prefill:decode split of the replicas (pp = 1, at least one of
    each); with `moe`, each also with the experts over each replica's chips (pp = 1), their tokens gathered
    and reduce-scattered as the engines do by default or sent by DeepEP's all-to-alls (tp > 1), and with
    attention data-parallel over its tensor-parallel group (tp > 1, pp = 1), as SGLang's and TensorRT-LLM's
    MoE deployments run."""
    found = []
    for tp in _divisors(chips):
        for pp in _divisors(chips // tp):
            replicas = chips // (tp * pp)
            pools = [0, *(range(1, replicas) if disaggregated and pp == 1 else ())]
            for prefill in pools:
                experts = [(False, False)]
                if moe and pp == 1:
                    experts += [(True, False), *([(True, True)] if tp > 1 else [])]
                for ep, a2a in experts:
                    for dp in (False, True) if moe and pp == 1 and tp > 1 else (False,):
                        found.append((tp, pp, prefill, ep, a2a, dp))
    return found


def base_limits(base: Base, scheduler: str) -> tuple[int | None, int]:
    """(max_num_seqs, max_num_batched_tokens) of the scenario under `scheduler`: its [engine] table's,
    or the profile's default where the table leaves one out; max_num_seqs None where the profile sets
    it from each candidate's KV cache (SGLang's)."""
    try:
        engine = base.scenario({"engine.scheduler": scheduler}).engine
    except UserError as error:
        raise UserError(f"--engines {scheduler}: the scenario does not run under it ({error})") from None
    return None if engine.sets_own_running else engine.max_num_seqs, engine.max_num_batched_tokens


def limit_grid(seqs: int | None, tokens: int) -> list[tuple[int | None, int]]:
    """The limits tried around (seqs, tokens), the base first (LIMIT_FACTORS), each pair once (a limit of 1
    halves to 1 again); the token budget alone where the engine sets its own running requests (seqs None)."""
    if seqs is None:
        return list(dict.fromkeys((None, max(1, round(tokens * b))) for b in LIMIT_FACTORS))
    return list(dict.fromkeys((max(1, round(seqs * a)), max(1, round(tokens * b)))
                              for a in LIMIT_FACTORS for b in LIMIT_FACTORS))


def launch_tuning(base: Base, scheduler: str) -> tuple[bool | None, bool]:
    """(chunked_prefill, padded_graphs) for the search's candidates under `scheduler`: where the scenario
    leaves them unset and the profile's defaults are off (trtllm-serve starts without chunked prefill, and
    replays decode graphs of 1 to 32, 64 and 128 sequences only, unpadded), the search launches the engine
    as its deployment guides do under load: with chunked prefill (without, a prompt longer than a step's
    token budget is refused) and with padded graphs up to max_num_seqs (TensorRT-LLM's
    docs/source/deployment-guide: cuda_graph_config max_batch_size and enable_padding: true). Its
    commands carry both settings."""
    stated, profile = base.table.get("engine", {}), PROFILES[scheduler]
    chunked = None if "chunked_prefill" in stated or profile.chunked_prefill else True
    padded = not profile.cuda_graph_padding and not {"cuda_graph_padding", "cuda_graph_max_tokens"} & set(stated)
    return chunked, padded


def enumerate_candidates(base: Base, chips: int, engines: list[str], disaggregated: bool,
                         moe: bool) -> list[Candidate]:
    """Every split of `chips` for each engine, at the engine's base limits (the grid around them is
    `with_limits`)."""
    found = []
    for scheduler in engines:
        seqs, tokens = base_limits(base, scheduler)
        chunked, padded = launch_tuning(base, scheduler)
        for tp, pp, prefill, ep, a2a, dp in splits(chips, moe, disaggregated):
            found.append(Candidate(chips, tp, pp, scheduler, seqs, tokens, prefill, expert_parallel=ep,
                                   attention_dp=dp, moe_all_to_all=a2a, chunked_prefill=chunked,
                                   padded_graphs=padded))
    return found


def with_limits(candidate: Candidate, base: tuple[int | None, int]) -> list[Candidate]:
    """`candidate` at every other point of the limit grid around `base`."""
    return [replace(candidate, max_num_seqs=seqs, max_num_batched_tokens=tokens)
            for seqs, tokens in limit_grid(*base)
            if (seqs, tokens) != (candidate.max_num_seqs, candidate.max_num_batched_tokens)]


def outside_domain(candidate: Candidate, domain: int) -> str | None:
    """Why a candidate's tensor-parallel group does not fit one scale-up domain, or None."""
    if candidate.tp <= domain and domain % candidate.tp == 0:
        return None
    if candidate.tp > domain:
        return f"tp={candidate.tp} spans more than one {domain}-chip scale-up domain"
    return f"tp={candidate.tp} does not divide the {domain}-chip scale-up domain (a group would straddle two)"

