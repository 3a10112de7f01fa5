"""A simulation's result document: the summary schema (summary.py) with what only a simulation knows:
the scenario as it ran, the engine, routing and fabric, and the bottleneck with its evidence
(diagnose/)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenpath.config.assumptions import DELIVERY_FIELDS, lookup
from tokenpath.config.units import format_duration
from tokenpath.delivery.lastmile import LastMile
from tokenpath.diagnose.bottleneck import (
    KV_FULL,
    SLOTS_HELD,
    TIME_PARTS,
    Evidence,
    Resource,
    bottleneck,
    bound_times_s,
    sample_steps,
    shares_of,
)
from tokenpath.diagnose.felt import APPLICATION, PARTS, felt_parts_s
from tokenpath.diagnose.overload import load_of
from tokenpath.sim.bands import attach_bands, shipped_records
from tokenpath.sim.envelope import calibrated_elsewhere, envelope, fitted_on
from tokenpath.sim.front_end import api_servers
from tokenpath.sim.regime import regime_block
from tokenpath.sim.summary import attribution_s, misses_slo, summarize, window_ns

if TYPE_CHECKING:  # simulate.py imports this module: Simulation.summary is its result document
    from tokenpath.engine.spec import EngineSpec
    from tokenpath.sim.run import Run
    from tokenpath.sim.scenario import Scenario
    from tokenpath.sim.simulate import Simulation


def result_document(sim: Simulation) -> tuple[dict[str, Any], str]:
    """The result schema for a simulation, and the one-line reason behind its bottleneck."""
    scenario = sim.scenario
    slo = {key: getattr(scenario.slo, key) for key in ("ttft", "ttfv", "tpot", "e2e")}
    document = summarize(sim.run, scenario.name, scenario.fingerprint(), slo,
                         warmup_requests=scenario.workload.warmup_requests)
    evidence = _evidence(sim, window_ns(sim.run) / 1e9)
    layer, reason = bottleneck(document["attribution_s"], evidence)
    document["scenario"]["assumptions"] = assumptions_block(scenario)
    document["resolved"] = resolved_block(sim)
    document["bottleneck"] = layer
    document["bottleneck_reason"] = reason
    document["load"] = evidence.load.document()
    _trust(document, sim, evidence)
    document["engine"] = {
        "replicas": scenario.deployment.replicas,
        "engines": sim.deployment.replicas,  # replicas x pipeline batches in flight
        "kv_capacity_tokens_per_engine": sim.deployment.kv_capacity_tokens,
        "steps": int(sum(len(t.step_start_ns) for t in sim.traces)),
        "preemptions": int(sum(t.preemptions for t in sim.traces)),
        "prefix_caching": scenario.engine.prefix_caching,
    }
    engine = sim.run.after(scenario.workload.warmup_requests).replica  # of the measured requests
    if engine is not None and not scenario.deployment.prefill_replicas:
        # (a replica's pp batches in flight are engines of their own, in a row: the replica's requests are theirs)
        served = np.bincount(engine // scenario.deployment.pp, minlength=scenario.deployment.replicas)
        document["routing"] = {
            "policy": scenario.deployment.routing,
            "requests_per_replica": served.tolist(),
            # the busiest replica's requests over the mean: 1.0 is perfectly even
            "imbalance": float(served.max() / served.mean()) if served.sum() else 0.0,
        }
    topology = sim.deployment.topology
    document["fabric"] = {
        "name": sim.deployment.fabric_name,
        "kind": topology.kind, "hosts": topology.hosts, "switches": topology.switches, "links": topology.cables,
        "diameter": topology.diameter(), "avg_hops": topology.avg_hops(),
        "bisection_bw_Bps": topology.bisection_bw_Bps(),
        "placement": sim.deployment.placement.hosts.tolist(),
    }
    return document, reason


def _locked_loop(sim: Simulation) -> bool:
    """A closed loop of fixed lengths (every request sent as one finishes, each prompt and answer the
    same length) whose requests took time to reach the engine (a network, the server's front end): the
    regime no latency row validates (sim/envelope.py)."""
    workload, upload_ns = sim.scenario.workload, sim.run.upload_ns
    closed = workload.max_concurrency is not None and workload.arrival.rate == float("inf")
    fixed = (workload.trace is None and workload.sessions is None
             and workload.input.kind == workload.output.kind == "fixed")
    return closed and fixed and upload_ns is not None and bool(upload_ns.any())


def _trust(document: dict[str, Any], sim: Simulation, evidence: Evidence) -> None:
    """How far to trust the document's figures: its `regime`, the `envelope` of the validated rows it lies
    in or not, and each headline figure's `band` (sim/bands.py)."""
    scenario, chip = sim.scenario, sim.deployment.chip
    speculative = scenario.engine.speculative
    document["regime"] = regime_block(scenario.engine.scheduler, scenario.engine.version, chip.name, chip.generation,
                                      sim.deployment.model, evidence.load.overloaded,
                                      evidence.parts_s.get("ttft", {}), evidence.mean_batch_seqs,
                                      None if speculative is None else speculative.method, _locked_loop(sim),
                                      scenario.deployment.attention_dp)
    records = shipped_records()
    here = fitted_on(scenario, sim.deployment.model.name, chip.name)
    elsewhere = calibrated_elsewhere(scenario.resolved_assumptions().fitted_on, here)
    document["envelope"] = envelope(document["regime"], records, elsewhere)
    assumptions = document["scenario"]["assumptions"]
    calibration = [*assumptions["calibration_files"], *filter(None, [assumptions["delivery_calibration"]])]
    # An application's stages are not what the rows validate: their mean time in each latency takes no band.
    stages_s = {key: evidence.parts_s.get(key, {}).get(APPLICATION, 0.0) for key in ("ttft", "ttfv")}
    stages_s["e2e"] = (document.get("attribution_s") or {}).get(APPLICATION, 0.0)
    attach_bands(document, records, list(dict.fromkeys(Path(path).name for path in calibration)),
                 engine_calibrated=bool(assumptions["calibration_files"]) and not elsewhere, given_s=stages_s)


def resolved_block(sim: Simulation) -> dict[str, Any]:
    """The result document's `resolved`: the scenario as it ran, in plain JSON values (seconds, bytes/s),
    with what the scenario left to defaults filled in: the chip's default fabric, the engine profile's
    host overlap and CUDA graphs, the last mile's assumptions and calibration. Two runs are named by
    where their blocks differ (report/compare.py)."""
    s, d = sim.scenario, sim.deployment
    dep, engine = s.deployment, d.engine  # the engine as the deployment ran it
    delivery = s.resolved_delivery()
    return {
        "deployment": {
            "model": d.model.name, "precision": s.model.precision, "expert_precision": s.model.expert_precision,
            "kv_precision": s.kv_precision(d.model),
            "chip": d.chip.name, "chips": dep.chips, "tp": dep.tp, "pp": dep.pp, "replicas": dep.replicas,
            "prefill_replicas": dep.prefill_replicas, "expert_parallel": dep.expert_parallel,
            "moe_all_to_all": dep.moe_all_to_all, "attention_dp": dep.attention_dp, "routing": dep.routing,
            "placement": placement_name(dep.placement), "fabric": {"kind": d.topology.kind, "name": d.fabric_name},
            "collectives": d.collectives.algorithm,
        },
        "engine": {
            "scheduler": engine.scheduler, "max_num_seqs": engine.max_num_seqs,
            "max_num_batched_tokens": engine.max_num_batched_tokens, "block_size": engine.block_size,
            "chunked_prefill": engine.chunked_prefill, "mixed_chunk": engine.mixed_chunk,
            "num_scheduler_steps": engine.num_scheduler_steps, "kv_admission": engine.kv_admission,
            "prefix_caching": engine.prefix_caching, "gpu_memory_utilization": d.memory_share,
            "cuda_graphs": engine.cuda_graphs, "cuda_graph_max_tokens": engine.cuda_graph_max_tokens,
            "cuda_graph_padding": engine.cuda_graph_padding,
            "prefill_graph_max_tokens": d.compute.prefill_graph_max_tokens,
            "host_overlap": d.compute.host_overlapped, "host_window_s": d.compute.host_window_s,
            "host_step_s": d.compute.host_step_s, "eager_host_per_kernel_s": d.compute.host_eager_per_kernel_s,
            "speculative": None if engine.speculative is None else {
                **engine.speculative.model_dump(), "draft_acceptance": s.workload.draft_acceptance,
                "mean_tokens_per_step": engine.speculative.mean_tokens(s.workload.draft_acceptance)},
        },
        "delivery": {
            "detokenize": d.front_end.detokenizes_in, "stream_interval_tokens": delivery.stream_interval,
            "network_rtt_s": delivery.network_rtt, "network_bw_Bps": delivery.network_bw,
            "invisible_token_fraction": delivery.invisible_token_fraction,
            "detokenize_per_token_s": delivery.detokenize_per_token, "output_per_token_s": delivery.output_per_token,
            "frame_per_event_s": delivery.frame_per_event,
            "frontend_per_request_s": delivery.frontend_per_request,
            "chat_template_per_request_s": delivery.chat_template_per_request,
            "chat_template_parse_per_request_s": delivery.chat_template_parse_per_request,
            "tokenize_per_token_s": delivery.tokenize_per_token,
            "tokenizer_batch_wait_s": delivery.tokenizer_batch_wait,
            "tokenizer_batch_max": delivery.tokenizer_batch_max,
            "api_servers": api_servers(s), "api_server_processes_per_engine": d.front_end.api_processes,
            "api_server_cpus_per_process": d.front_end.api_cpus,
            "host_link_bw_Bps": delivery.host_link_bw, "host_link_latency_s": delivery.host_link_latency,
            "calibration": None if delivery.calibration is None else str(delivery.calibration),
            "calibrated_server": None if delivery.calibration is None else delivery.calibrated_server,
        },
        "workload": _workload_block(sim),
    }


def _workload_block(sim: Simulation) -> dict[str, Any]:
    """The resolved workload: as generated, or as a trace replayed it (its requests and their mean rate,
    no pattern or burstiness drawn)."""
    workload, arrival = sim.scenario.workload, sim.scenario.workload.arrival
    block = {"requests": workload.num_requests, "warmup_requests": workload.warmup_requests,
             "rate_per_s": arrival.rate if math.isfinite(arrival.rate) else None,  # null: all at t=0
             "pattern": arrival.pattern, "burstiness": arrival.burstiness, "max_concurrency": workload.max_concurrency,
             "trace": None, "chat_template_tokens": sim.scenario.chat_template_tokens()}
    if workload.trace is not None:
        sent_s = sim.requests.arrival_s
        span_s = float(sent_s[-1] - sent_s[0]) if len(sent_s) else 0.0
        block.update(requests=len(sent_s), rate_per_s=(len(sent_s) - 1) / span_s if span_s > 0 else None,
                     pattern=None, burstiness=None, trace=str(workload.trace.path))
    return block


def assumptions_block(scenario: Any) -> dict[str, Any]:
    """The result document's `scenario.assumptions`: what differs from the registry (assumptions.py:
    `overridden`, `calibrated`, `calibration_files`), plus the assumed last-mile costs the scenario's
    [delivery] table sets to other values than the registry's (`delivery_fields`, by assumption name)
    and the delivery calibration file in use."""
    block = scenario.resolved_assumptions().describe()
    given = scenario.delivery
    block["delivery_fields"] = {name: float(getattr(given, field)) for name, field in DELIVERY_FIELDS.items()
                                if field in given.model_fields_set and getattr(given, field) != lookup(name).value}
    calibration = scenario.resolved_delivery().calibration
    block["delivery_calibration"] = None if calibration is None else str(calibration)
    return block


def _bound_shares(sim: Simulation) -> tuple[dict[str, float], dict[str, float]]:
    """What bounds the steps' compute time (bound_times_s's parts, as shares): over every step, and over the
    steps that hold a prompt (a first token's). Evenly spaced steps of each trace are read, those that hold a
    prompt and the others sampled apart, each sample standing for its kind's steps. Speculating, step_time_s
    takes the sequences sampled; the trace keeps those taking part (the same where no prompt is in progress:
    the verify steps whose graphs and host time the count sets)."""
    speculating = sim.scenario.engine.speculative is not None
    prompt_times_s = dict.fromkeys(TIME_PARTS, 0.0)
    all_times_s = dict(prompt_times_s)
    for t in sim.traces:
        holds_prompt = t.step_tokens != t.step_logits
        for steps, in_prompts in ((np.flatnonzero(holds_prompt), True), (np.flatnonzero(~holds_prompt), False)):
            sampled = sample_steps(steps)
            times_s = bound_times_s(sim.deployment.compute, [
                (int(t.step_tokens[k]), int(t.step_logits[k]), int(t.step_attn_pairs[k]), int(t.step_kv_read_tokens[k]),
                 int(t.step_chunk_context_tokens[k]), t.step_traffic_ns[k] / 1e9, t.step_ahead_ns[k] / 1e9,
                 bool(t.step_scheduled[k]), int(t.step_seqs[k]) if speculating else None) for k in sampled])
            for part, time_s in times_s.items():
                all_times_s[part] += time_s * len(steps) / max(len(sampled), 1)
                if in_prompts:
                    prompt_times_s[part] += time_s
    return shares_of(all_times_s), shares_of(prompt_times_s)


def _evidence(sim: Simulation, window_s: float) -> Evidence:
    traces, scenario = sim.traces, sim.scenario
    seqs = np.concatenate([t.step_seqs for t in traces])
    bounds, prompt_bounds = _bound_shares(sim)
    # Each engine's step time by layer: compute, traffic, and the host blocking it (delivery).
    busy_ns = [{"compute": int(t.step_compute_ns.sum()), "traffic": int(t.step_traffic_ns.sum()),
                "delivery": int(t.step_blocking_ns.sum())} for t in traces]
    step_mix_s = {part: sum(engine[part] for engine in busy_ns) / 1e9 for part in ("compute", "traffic", "delivery")}
    step_s = sum(step_mix_s.values())
    skipped = scenario.workload.warmup_requests
    measured = sim.run.after(skipped)
    prefixes = sim.requests.prefixes
    held = None if prefixes is None or prefixes.warm is None else (prefixes.warm_tokens() > 0)[skipped:]
    attributed = attribution_s(measured) or {}
    evidence = Evidence(
        busy_fraction=min(1.0, step_s / max(len(traces), 1) / window_s) if window_s else 0.0,
        mean_batch_seqs=float(seqs.mean()) if len(seqs) else 0.0,
        preemptions=sum(t.preemptions for t in traces),
        memory_bound_fraction=bounds["memory"],
        fixed_bound_fraction=bounds["fixed"],
        launch_bound_fraction=bounds["launch"],
        host_bound_fraction=bounds["host"],
        prompt_step_shares=prompt_bounds if any(prompt_bounds.values()) else {},
        traffic_detail=traffic_detail(sim),
        network_rtt_s=scenario.delivery.network_rtt,
        detokenize=sim.deployment.front_end.detokenizes_in,
        host_share_of_step=step_mix_s["delivery"] / step_s if step_s else 0.0,
        load=load_of(measured.sent_ns, measured.ttft_ns, measured.e2e_ns, measured.completed, held),
        delivery_detail_s=attributed.get("delivery_detail", {}),
        application_detail_s=attributed.get("application_detail", {}),
        application_before=_before_last_call(scenario),
        max_num_seqs=sim.deployment.engine.max_num_seqs,
        slots_held_fraction=_slots_held(sim),
        kv_full_fraction=_kv_full(sim),
        prompts_pause_decodes=_prompts_pause_decodes(sim.deployment.engine),
    )
    engine_busy_s = max((sum(engine.values()) for engine in busy_ns), default=0) / 1e9
    return replace(evidence, resources=_resources(sim, evidence, step_mix_s, engine_busy_s, window_s),
                   **_felt(sim, measured, step_mix_s))


def _prompts_pause_decodes(engine: EngineSpec) -> str:
    """Where the engine runs prompts in steps of their own while its decoding sequences pause, in words
    naming the setting that mixes them (EngineSpec.prefills_alone); else ''."""
    if not engine.prefills_alone:
        return ""
    setting = engine.profile.prefills_alone_unless
    return f"{engine.profile.engine}'s prompt steps run without the decodes ({setting} off)"


def _before_last_call(scenario: Scenario) -> frozenset[str]:
    """The application's stages that run before the call whose answer the user reads: those before the
    model and, in an agent loop, those between its calls."""
    app = scenario.application
    if app is None:
        return frozenset()
    return frozenset(app.before_model() | set(app.model.loop.between if app.model.loop else ()))


def _resources(sim: Simulation, evidence: Evidence, step_mix_s: dict[str, float], engine_busy_s: float,
               window_s: float) -> list[Resource]:
    """The serial resources requests share: each engine (`engine_busy_s`: the busiest one's step time),
    the front end's API-server processes and its detokenizer process; with disaggregated pools, each
    replica's links for KV caches. Each counts at its busiest instance, which saturates first."""
    if window_s <= 0 or not sim.traces:
        return []
    part = max(step_mix_s, key=step_mix_s.get)
    if part == "compute":
        why = f"mostly compute at a mean batch of {evidence.mean_batch_seqs:.0f} sequences, {evidence.bound}-bound"
    elif part == "traffic":
        why = f"mostly fabric traffic: {evidence.traffic_detail}"
    else:
        why = f"mostly the host blocking it (the ids' copy, detokenizing in the {evidence.detokenize})"
    capacity, full = sim.deployment.kv_capacity_tokens, evidence.kv_full_fraction
    if full >= KV_FULL and (evidence.preemptions
                            or evidence.mean_batch_seqs < SLOTS_HELD * sim.scenario.engine.max_num_seqs):
        why += (f"; its batch held by its KV cache of {capacity:,} tokens, {full:.0%} full on average, "
                f"{evidence.preemptions} preemptions")
    found = [Resource("busiest engine" if len(sim.traces) > 1 else "engine", part, engine_busy_s / window_s, why,
                      one_at_a_time=False)]
    delivery, layout = sim.scenario.resolved_delivery(), sim.deployment.front_end
    host_busy = [t.host_busy_ns or {} for t in sim.traces]
    api_ns = max((busy.get("API server", 0) for busy in host_busy), default=0)
    tokenizer_ns = max((busy.get("tokenizer thread", 0) for busy in host_busy), default=0)
    detokenizer_ns = max((busy.get("detokenizer", 0) for busy in host_busy), default=0)
    last_mile = LastMile(delivery, layout) if api_ns or detokenizer_ns else None
    # What the processes after the engine take in: every token, or each SSE event's (LastMile.outputs_per_event)
    unit = "event" if last_mile is not None and last_mile.outputs_per_event else "token"
    prompt = float(sim.requests.input_tokens.mean()) if len(sim.requests) else 0.0
    processes = f"{layout.api_processes} process{'es' if layout.api_processes > 1 else ''} for each engine"
    tokenize_s = 0.0 if last_mile is None else last_mile.tokenize_s(round(prompt))
    if api_ns:
        request_s = last_mile.request_cost_s(round(prompt))
        if layout.tokenizes_in_thread:
            request = f"{format_duration(request_s - tokenize_s)} a request (parse, template)"
        else:
            request = f"{format_duration(request_s)} a request (parse, template, tokenize {prompt:.0f} tokens)"
        tokens = {"api-server": "detokenizing and framing", "engine": "framing"}.get(
            layout.detokenizes_in, "taking in the detokenizer's text and framing")
        found.append(Resource(
            "front end's busiest API-server process", "delivery", api_ns / 1e9 / window_s,
            f"{request} and {tokens} every {unit}, {processes}, {layout.api_cpus:.2g} of each", front_end=True))
    if tokenizer_ns:
        found.append(Resource(
            "tokenizer thread of the busiest API-server process", "delivery", tokenizer_ns / 1e9 / window_s,
            f"{format_duration(tokenize_s)} a request (tokenize {prompt:.0f} tokens), "
            f"one thread in each of {processes}, off its event loop", front_end=True))
    if detokenizer_ns:
        found.append(Resource("detokenizer process", "delivery", detokenizer_ns / 1e9 / window_s,
                              f"detokenizing every {unit} at {format_duration(delivery.detokenize_per_token)} "
                              f"{'an' if unit == 'event' else 'a'} {unit}, {layout.detokenizer_cpus:.2g} of it for "
                              "each engine", front_end=True))
    if sim.kv_link_busy_ns is not None and len(sim.kv_link_busy_ns):
        found.append(Resource("KV-transfer port of the busiest replica", "traffic",
                              float(sim.kv_link_busy_ns.max()) / 1e9 / window_s,
                              "each request's KV cache from a prefill to a decode replica, one at a time (one per "
                              "rank's link under attention data-parallel)"))
    return found


def _fullest(sim: Simulation, held: Callable[[Any], np.ndarray]) -> float:
    """The largest over the engines of the share `held(trace)` gives each step (of its batch slots, of its KV
    cache), averaged over the engine's steps weighted by their time."""
    fullest = 0.0
    for t in sim.traces:
        step_ns = t.step_compute_ns + t.step_traffic_ns
        if len(step_ns) and step_ns.sum():
            fullest = max(fullest, float((held(t) * step_ns).sum() / step_ns.sum()))
    return fullest


def _slots_held(sim: Simulation) -> float:
    """The share of its batch slots (max_num_seqs) the fullest engine's steps hold on average (_fullest)."""
    return _fullest(sim, lambda t: t.step_seqs / sim.deployment.engine.max_num_seqs)


def _kv_full(sim: Simulation) -> float:
    """The share of its KV cache the fullest engine's steps hold on average (_fullest): the tokens each step
    reads (every running sequence's context) over the engine's capacity."""
    return _fullest(sim, lambda t: np.minimum(t.step_kv_read_tokens / sim.deployment.kv_capacity_tokens, 1.0))


def _felt(sim: Simulation, run: Run, step_mix_s: dict[str, float]) -> dict[str, dict[str, Any]]:
    """The Evidence fields on what users feel, over the measured requests (`run`, after the warm-up):
    each felt metric's parts, the network's share of them, and the SLOs with the share of requests that
    miss each."""
    scenario = sim.scenario
    done = run.completed
    slo_s = {key: getattr(scenario.slo, key) for key in ("ttft", "ttfv", "tpot", "e2e")
             if getattr(scenario.slo, key) is not None}
    misses = misses_slo(run, slo_s)
    shares = {metric: float(missed[done].mean()) if done.any() else 0.0 for metric, missed in misses.items()}
    found: dict[str, Any] = {"slo_s": slo_s, "slo_miss_share": shares}
    if run.prefill_start_ns is None or run.ttft_engine_ns is None or not done.any():
        return found
    last_mile = LastMile(scenario.resolved_delivery(), sim.deployment.front_end)
    # The prompts as the engine charged their upload (engine/loop.py): a chat template's tokens included.
    inputs = sim.requests.input_tokens[len(sim.run) - len(run):][done]
    lengths, which = np.unique(inputs, return_inverse=True)
    network_in_ns = np.array([last_mile.upload_ns(int(p)) for p in lengths], np.int64)[which]
    upload_ns = network_in_ns if run.upload_ns is None else run.upload_ns[done]
    # The network's part: the upload's, and the first (or last) event's trip back.
    network_ns = network_in_ns + last_mile.event_network_ns(1)
    total = sum(step_mix_s.values()) or 1.0
    e2e_parts_ns = {part: getattr(run, f"{part}_ns")[done] for part in PARTS}
    model_sent_ns = before_ns = earlier_ns = None
    if run.application_ns is not None:
        e2e_parts_ns[APPLICATION] = run.application_ns[done]
        model_sent_ns, before_ns = run.model_sent_ns[done], run.application_before_ns[done]
    if run.earlier_calls_ns is not None:
        earlier_ns = {part: values[done] for part, values in run.earlier_calls_ns.items()}
    parts = felt_parts_s(run.sent_ns[done], upload_ns, run.prefill_start_ns[done], run.ttft_engine_ns[done],
                         run.ttft_ns[done], run.ttfv_ns[done], e2e_parts_ns, run.output_tokens[done],
                         {part: value / total for part, value in step_mix_s.items()}, model_sent_ns, before_ns,
                         earlier_ns)
    network_s = float(network_ns.mean()) / 1e9
    found.update(parts_s=parts, network_s={"ttft": network_s, "ttfv": network_s, "e2e": network_s},
                 front_in_s=float((upload_ns - network_in_ns).mean()) / 1e9,
                 earlier_calls_compute_s=float(earlier_ns["compute"].mean()) / 1e9 if earlier_ns else 0.0)
    return found


def traffic_detail(sim: Simulation) -> str:
    """What the fabric carries each step, in words."""
    costs, dep = sim.deployment.costs, sim.scenario.deployment
    parts = []
    if costs.allreduces_per_step:
        parts.append(f"{costs.allreduces_per_step} tensor-parallel all-reduces per step across {dep.tp} chips")
    if costs.all_to_alls_per_step:
        parts.append(f"{costs.all_to_alls_per_step} expert-parallel all-to-alls per step across {dep.tp} chips")
    if dep.pp > 1:
        parts.append(f"{dep.pp - 1} pipeline hand-offs")
    if dep.prefill_replicas:
        parts.append("each request's KV cache from a prefill to a decode replica")
    what = ", ".join(parts) or "nothing"
    return f"{what} on a {sim.deployment.topology.kind} fabric"


def placement_name(placement: str | list[int]) -> str:
    """A deployment's placement as the result document names it: a strategy's name, or "explicit"."""
    return placement if isinstance(placement, str) else "explicit"
