"""A scenario's deployment resolved: the model and chip, the compute model, the fabric and the
placement of every replica on it, the step costs and the KV cache each engine holds; and the check
that every request of a workload fits it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpath.compute.chip import ChipSpec, load_chip
from tokenpath.compute.drafter import PROJECTION_ONCE_A_STEP, DraftCost, drafter_compute
from tokenpath.compute.model import checkpoint_precision, load_model
from tokenpath.compute.model_spec import ModelSpec
from tokenpath.compute.precision import PRECISION_BYTES
from tokenpath.compute.roofline import ComputeModel
from tokenpath.config import files
from tokenpath.config.assumptions import Assumptions
from tokenpath.config.errors import DoesNotFit, UserError
from tokenpath.delivery.frontend import Layout
from tokenpath.engine.costs import GroupStepCosts
from tokenpath.engine.expert_kernels import weight_only_expert_time
from tokenpath.engine.host_time import eager_host_paid, host_step_cost
from tokenpath.engine.placement import Placement, place
from tokenpath.engine.profiles import listed
from tokenpath.engine.spec import EngineSpec
from tokenpath.engine.speculative import Speculation, mtp_head_shared
from tokenpath.fabric.build import build_topology, default_fabric
from tokenpath.fabric.collectives import NVLS_ALGORITHMS, Collectives, fastest_s
from tokenpath.fabric.spec import SwitchFabric
from tokenpath.fabric.topology import Topology
from tokenpath.sim import front_end
from tokenpath.sim.scenario import Scenario
from tokenpath.workload import Requests


@dataclass(frozen=True)
class Deployment:
    """The resolved hardware and models of a scenario, shared by every replica."""

    model: ModelSpec
    chip: ChipSpec
    compute: ComputeModel
    topology: Topology
    collectives: Collectives
    placement: Placement
    costs: GroupStepCosts
    kv_capacity_tokens: int   # per engine
    memory_share: float       # the engine's share of each chip's memory (EngineSpec.memory_share)
    replicas: int             # engines: data-parallel replicas x pipeline batches in flight
    # The scenario's [engine] with what it sets from the sized deployment (EngineSpec.with_running_from_kv):
    # what each replica runs.
    engine: EngineSpec
    fabric_name: str = ""     # what the fabric is, and whether it is the chip's default
    front_end: Layout = Layout()  # each engine's share of the front end's processes (sim/front_end.py)


def chip_fabric(chip: ChipSpec, chips: int) -> tuple[object, str]:
    """The fabric of `chips` chips of this kind when a scenario gives none, and a line naming it: the
    chip's own scale-up domain, nodes of it on NIC rails beyond (fabric/build.py, default_fabric)."""
    return default_fabric(chip.name, chips, chip.scaleup_domain, chip.scaleup, chip.nic_bw_Bps)


def gives_fabric(fabric: Any) -> bool:
    """Whether `deployment.fabric` describes a fabric: anything but the default table, whose collective
    algorithm alone may be set (it applies to the chip's own fabric, `simulated_fabric`)."""
    return fabric.model_copy(update={"algorithm": SwitchFabric().algorithm}) != SwitchFabric()


def simulated_fabric(scenario: Scenario, chip: ChipSpec | None = None) -> tuple[Any, str]:
    """The fabric the scenario's deployment is simulated on, and a line naming it: its `deployment.fabric`
    where that gives one, else its chip's own (`chip_fabric`) with any algorithm set."""
    fabric, chips = scenario.deployment.fabric, scenario.deployment.chips
    if gives_fabric(fabric):
        return fabric, f"{fabric.kind} given in deployment.fabric"
    own, name = chip_fabric(chip or load_chip(scenario.deployment.chip), chips)
    if fabric.algorithm != own.algorithm:
        own = own.model_copy(update={"algorithm": fabric.algorithm})
        name += f", algorithm {fabric.algorithm}"
    return own, name


def indexes_on_chip_bytes(scenario: Scenario, chip: ChipSpec) -> float:
    """The bytes of the application's vector indexes searched on the deployment's kind of chip: each held on
    one chip of every replica (its requests search their own copy, on its GPUs: docs/application.md), beside
    the engine, which sizes its KV cache around them (ComputeModel.kv_capacity_tokens, `held_bytes`)."""
    if scenario.application is None:
        return 0.0
    indexes = [stage.index for stage in scenario.application.stages if stage.index is not None]
    on_chip = [index for index in indexes if index.on != "cpu" and load_chip(index.on).name == chip.name]
    return float(sum(index.index_bytes for index in on_chip))


def build_deployment(scenario: Scenario, assumptions: Assumptions | None = None) -> Deployment:
    """Resolve names, check the configuration is possible, place the chips and size the KV cache,
    under the scenario's assumptions, or `assumptions` where given (the objects built keep the values they
    read).

    Pipeline parallelism runs as `pp` batches in flight per replica (vLLM's virtual engines): each is
    an engine of its own whose step crosses every stage, with 1/pp of the replica's KV cache.
    """
    assumptions = assumptions or scenario.resolved_assumptions()
    with assumptions.active():  # fabric and engine read theirs through `assumed`
        return _build_deployment(scenario, assumptions)


def _build_deployment(scenario: Scenario, assumptions: Assumptions) -> Deployment:
    dep = scenario.deployment
    group = dep.tp * dep.pp
    if group > dep.chips:
        raise UserError(f"deployment.tp: tp*pp = {group} is larger than deployment.chips ({dep.chips}); "
                        "lower --tp/pp or raise --chips")
    if dep.chips % group:
        raise UserError(f"deployment.chips: {dep.chips} chips do not split into replicas of tp*pp={group}; "
                        f"use a multiple of {group}")
    model = load_model(scenario.model_source())
    chip = load_chip(dep.chip, assumptions)
    if model.num_heads % dep.tp:
        raise UserError(f"deployment.tp: {model.name} has {model.num_heads} attention heads, "
                        f"not divisible by tp={dep.tp}")
    if dep.attention_dp and (dep.tp == 1 or dep.pp > 1):
        raise UserError(f"deployment.attention_dp: attention is data-parallel over a replica's tp chips, modelled "
                        f"with tp > 1 and pp = 1 (got tp={dep.tp}, pp={dep.pp}); raise tp or set attention_dp = false")
    engine = scenario.engine
    refusal = engine.profile.attention_dp_refusal(model.is_moe, model.architecture) if dep.attention_dp else None
    if refusal:
        replicas = engine.profile.attention_dp_models == "moe"  # (its ranks of a dense model: replicas of tp 1)
        raise UserError(f"deployment.attention_dp: {refusal}; set it to false"
                        + (f" and deployment.tp = 1 for {dep.chips} replicas" if replicas else ""))
    pool = max(dep.prefill_replicas, dep.replicas - dep.prefill_replicas)  # the replicas of one server
    if dep.expert_parallel and model.is_moe and pool > 1 and engine.profile.data_parallel_shares_experts:
        raise UserError(f"deployment.expert_parallel: the data-parallel engines of one {engine.profile.engine} server "
                        "share their experts and step together, which tokenpath models as attention data-parallel "
                        f"ranks of one chip each: set deployment.tp = {dep.tp * pool} "
                        "and deployment.attention_dp = true, or expert_parallel = false")
    refusal = engine.profile.expert_parallel_refusal(model.num_experts, dep.tp) if dep.expert_parallel else None
    if refusal:
        fits = [str(tp) for tp in range(2, dep.tp) if not model.num_experts % tp and not model.num_heads % tp]
        raise UserError(f"deployment.expert_parallel: {refusal}; set deployment.tp to one that divides them"
                        + (f" ({listed(fits)})" if fits else "") + ", or expert_parallel = false")
    refusal = engine.profile.all_to_all_refusal(dep.tp, model.experts_per_token) if dep.moe_all_to_all else None
    if refusal:
        raise UserError(f"deployment.moe_all_to_all: {refusal}; set it to false or use more chips")
    if dep.attention_dp and engine.profile.attention_dp_splits_budget and engine.max_num_seqs < dep.tp:
        # SGLang: "max_running_requests (...) is less than dp_size (...)" (managers/scheduler.py)
        raise UserError(f"engine.max_num_seqs: {engine.max_num_seqs} running requests do not divide over "
                        f"{dep.tp} attention ranks, one a rank at least, which SGLang requires; raise it to {dep.tp} "
                        "or more")
    if dep.attention_dp and engine.num_scheduler_steps > 1:
        raise UserError("engine.num_scheduler_steps: vLLM V0's multi-step scheduling ran without attention "
                        "data-parallel (SGLang's ranks schedule a step at a time); set it to 1 or attention_dp = false")
    if scenario.model.expert_precision is not None and not model.is_moe:
        raise UserError(f"model.expert_precision: {model.name} has no experts; remove expert_precision")
    if engine.speculative is not None and engine.speculative.method == "mtp" and not model.mtp_layers:
        raise UserError(f"engine.speculative.method = \"mtp\": {model.name}'s checkpoint has no multi-token-prediction "
                        "layers (num_nextn_predict_layers); use eagle3, ngram or draft_model")
    if dep.prefill_replicas and not dep.prefill_replicas < dep.replicas:
        raise UserError(f"deployment.prefill_replicas: {dep.prefill_replicas} of {dep.replicas} replicas leaves none "
                        "to decode; use fewer, or more chips")
    if dep.prefill_replicas and dep.pp > 1:
        raise UserError("deployment.prefill_replicas: disaggregated serving is modelled with pp = 1 only")
    if dep.prefill_replicas and dep.routing != "round_robin":
        raise UserError(f"deployment.routing: disaggregated serving routes round-robin only (got {dep.routing}); "
                        "set routing = \"round_robin\" or prefill_replicas = 0")
    if dep.prefill_replicas and scenario.workload.sessions is not None:
        raise UserError("deployment.prefill_replicas: disaggregated serving is modelled without multi-turn sessions; "
                        "remove workload.sessions or set prefill_replicas = 0")
    if dep.prefill_replicas and scenario.workload.max_concurrency is not None:
        raise UserError("deployment.prefill_replicas: disaggregated serving needs open-loop arrivals; "
                        "unset workload.max_concurrency")
    host = host_step_cost(engine.scheduler, engine.host_overlap, engine.eager_host)
    # The kernels a step runs, where the engine's model code counts them its own way (and runs that code).
    engine_kernels, fused_kernels = None, 0
    fp8_linears = chip.compute_precision(scenario.model.precision) == "fp8"
    block_scaled = model.fp8_block_scaled and fp8_linears
    if engine.profile.layer_kernels is not None and eager_host_paid(engine.scheduler, engine.eager_host):
        engine_kernels = engine.profile.layer_kernels.per_step_kernels(model, block_scaled)
    if engine.profile.compiled_fusions is not None and engine.cuda_graphs != "none":  # (not --enforce-eager)
        fused_kernels = engine.profile.compiled_fusions(model, engine.version, fp8_linears and not block_scaled)
    graph_max_tokens = engine.graph_max_tokens(chip.hbm_bytes, dep.tp)
    prefill_graph_tokens = engine.prefill_graph_max_tokens(model.is_mla, chip.generation, dep.pp, dep.attention_dp)
    compute = ComputeModel(model, chip, dep.tp, scenario.model.precision, scenario.kv_precision(model),
                           pp=dep.pp, cuda_graphs=engine.cuda_graphs, cuda_graph_max_tokens=graph_max_tokens,
                           gemm_kernels_of=engine.profile.launched_with,
                           cuda_graph_sizes=engine.graph_batch_sizes(chip.hbm_bytes, dep.tp),
                           prefill_graph_max_tokens=prefill_graph_tokens,
                           expert_parallel=dep.expert_parallel and model.is_moe,
                           expert_dispatch=dep.moe_all_to_all,
                           host_window_s=host.window_s, host_step_s=host.step_s,
                           host_per_sequence_s=host.per_sequence_s,
                           host_overlapped=host.overlapped, host_eager_per_kernel_s=host.eager_per_kernel_s,
                           engine_kernels=engine_kernels, fused_kernels=fused_kernels,
                           fused_mxfp4_moe_calls=engine.profile.fused_mxfp4_moe_calls,
                           assumptions=assumptions, expert_precision=scenario.model.expert_precision,
                           attention_dp=dep.attention_dp, attention_dp_whole=engine.profile.attention_dp_whole | (
                               engine.profile.attention_dp_whole_all_to_all if dep.moe_all_to_all else frozenset()),
                           pp_extra_layers=engine.profile.pp_extra_layers,
                           latent_attention=engine.latent_attention,
                           mla_absorbed_bf16=engine.profile.mla_absorbed_bf16(chip.generation),
                           mxfp4_layout=engine.profile.mxfp4_layout(chip.generation, engine.version),
                           weight_only_expert_time=weight_only_expert_time(engine.profile.mxfp4_weight_only_experts,
                                                                           chip.generation))
    drafter = _drafter(scenario, model, chip, assumptions)
    sampler_bytes = (assumptions.value("sampler_profile_bytes_per_logit")
                     if engine.profile.sampler_in_memory_profile else None)
    share = engine.memory_share(chip.hbm_bytes, dep.tp, dep.pp, dep.attention_dp, prefill_graph_tokens, model.is_mla,
                                chip.generation)
    try:
        chip_seqs = engine.rank_limits(dep.tp)[0] if dep.attention_dp else engine.max_num_seqs  # one scheduler's
        kv_tokens = compute.kv_capacity_tokens(share, engine.max_num_batched_tokens, chip_seqs,
                                               drafter if engine.drafter_in_pool else None,
                                               sampler_bytes, engine.profile.memory_share_covers,
                                               engine.kv_margin(chip.generation),
                                               engine.sliding_pool_ratio(chip.generation, model.architecture),
                                               engine.block_size,
                                               engine.profile.pp_batches_share_running_cap,
                                               indexes_on_chip_bytes(scenario, chip)) // dep.pp
    except DoesNotFit as error:
        raise DoesNotFit(f"{error}{_as_published(scenario)}") from None
    fabric, fabric_name = simulated_fabric(scenario, chip)
    topology = build_topology(fabric, chip.scaleup_bw_Bps, dep.chips, chip.generation)
    placement = place(dep.placement, dep.replicas, dep.pp, dep.tp, topology.hosts)
    if fabric.algorithm in NVLS_ALGORITHMS and not engine.nccl_nvls:
        raise UserError(f"fabric.algorithm = \"{fabric.algorithm}\": {engine.profile.engine} runs NCCL without NVLS "
                        "(NCCL_NVLS_ENABLE=0) unless told; set engine.nccl_nvls = true, or another algorithm")
    collectives = Collectives(topology, fabric.algorithm, nvls=engine.nccl_nvls)
    speculation = draft = None
    if engine.speculative is not None:
        drafts = engine.speculative.num_speculative_tokens
        speculation = Speculation(drafts, scenario.workload.draft_acceptance, scenario.seed)
        later = (_drafter(scenario, model, chip, assumptions, later_pass=True)
                 if engine.speculative.method in PROJECTION_ONCE_A_STEP else None)
        draft = None if drafter is None else DraftCost(drafter, drafts, later, _all_reduce_s(collectives, placement))
    costs = GroupStepCosts(compute, collectives, placement, dep.expert_parallel, speculation, draft,
                           dep.moe_all_to_all)
    engines = dep.replicas * dep.pp
    # SGLang's schedulers: one per replica, or per attention rank with data-parallel attention
    workers = dep.tp if dep.attention_dp else 1
    if dep.pp > 1 and engine.profile.pp_batches_share_running_cap:
        # One scheduler over the pp batches in flight (each simulated as an engine of its own): the running
        # requests its profile sets from the replica's whole pool, capped together, a pp-th a batch.
        whole = engine.with_running_from_kv(kv_tokens * dep.pp, model.max_context, workers)
        resolved = whole.model_copy(update={"max_num_seqs": max(whole.max_num_seqs // dep.pp, 1)})
    else:
        resolved = engine.with_running_from_kv(kv_tokens, model.max_context, workers)
    return Deployment(model, chip, compute, topology, collectives, placement, costs, kv_tokens, share, engines,
                      resolved, fabric_name, front_end.layout(scenario, engines))


def _all_reduce_s(collectives: Collectives, placement: Placement) -> Callable[[float], float] | None:
    """An all-reduce of a size over each replica's tensor-parallel group, at the fastest of what it can cost
    (None for a group of one)."""
    if placement.tp == 1:
        return None
    candidates = collectives.candidates("all_reduce", placement.tp_groups())
    return lambda size_bytes: fastest_s(candidates, size_bytes)


def _as_published(scenario: Scenario) -> str:
    """Where a catalog model's published checkpoint stores some weights in fewer bytes than the scenario
    stores any (gpt-oss's MXFP4 experts beside an fp8 scenario): how to simulate it as published; else ''."""
    if files.exists(scenario.model_source()):
        return ""
    precision, experts = checkpoint_precision(scenario.model.name)
    published = precision, experts or precision
    asked = scenario.model.precision, scenario.model.expert_precision or scenario.model.precision
    if min(PRECISION_BYTES[p] for p in published) >= min(PRECISION_BYTES[p] for p in asked):
        return ""
    flags = f"--precision {precision}" + (f" --set model.expert_precision={experts}" if experts else "")
    stored = precision + (f" with {experts} routed experts" if experts else "")
    return f" ({scenario.model.name}'s published checkpoint is {stored}: {flags})"


def _drafter(scenario: Scenario, model: ModelSpec, chip: ChipSpec, assumptions: Assumptions,
             later_pass: bool = False) -> ComputeModel | None:
    """The speculative-decoding drafter's model on each chip of a replica (compute/drafter.py), or None;
    `later_pass`: that of its passes after the first."""
    speculative, dep = scenario.engine.speculative, scenario.deployment
    if speculative is None:
        return None
    draft = None
    if speculative.method == "draft_model":
        source = scenario.resolve_path(speculative.draft_model)
        draft = load_model(source if files.exists(source) else speculative.draft_model)
        if draft.num_heads % dep.tp:
            raise UserError(f"engine.speculative.draft_model: {draft.name} has {draft.num_heads} attention heads, "
                            f"not divisible by tp={dep.tp}; choose another draft model or tp")
    engine = scenario.engine
    return drafter_compute(model, speculative.method, chip, dep.tp, scenario.model.precision,
                           scenario.kv_precision(model),
                           mtp_head_shared(engine.profile.engine, engine.version), dep.pp, draft, later_pass,
                           assumptions=assumptions, latent_attention=engine.latent_attention,
                           mla_absorbed_bf16=engine.profile.mla_absorbed_bf16(chip.generation),
                           mxfp4_layout=engine.profile.mxfp4_layout(chip.generation, engine.version),
                           gemm_kernels_of=engine.profile.launched_with)


def check_fits(requests: Requests, deployment: Deployment, scenario: Scenario, measured_in: str | None = None) -> None:
    """Refuse a workload with a request the deployment cannot serve. It looks only at the lengths (and
    sessions), so it can run before the prefix keys are built (workload.generate's `check`). `measured_in`:
    the file the requests come from (`calibrate engine --from`), which the message names: its lengths are
    what the server was sent, so the scenario is what to fix."""
    total = requests.input_tokens + requests.output_tokens
    worst = int(np.argmax(total))
    longest = int(total[worst])
    turn = 0 if requests.sessions is None else int(requests.sessions.turn[worst])
    if turn:  # a later turn carries every turn before it: fewer turns is the fix to name first
        where = f"workload.sessions.turns: request {worst} (turn {turn + 1} of its session)"
        lengths = "workload.sessions.turns or the input/output lengths"
    else:
        where, lengths = f"workload: request {worst}", "the input/output lengths"
    if measured_in is not None:
        where = f"{measured_in}: request {worst}"
    if longest > deployment.model.max_context:
        fix = (f"lower {lengths} (or their max)" if measured_in is None else
               "the file was measured on another model, or is damaged: calibrate with the scenario of the server it "
               "measured")
        raise UserError(f"{where} needs {longest} tokens of context but {deployment.model.name} holds "
                        f"{deployment.model.max_context}; {fix}")
    held = scenario.engine.longest_request_tokens(deployment.kv_capacity_tokens)
    if longest > held:
        fix = (f"raise --tp, use fp8, or lower {lengths}" if measured_in is None else
               "give the scenario the deployment of the server it measured (its chips, tp, precision)")
        raise DoesNotFit(f"{where} needs {longest} tokens of KV cache but one replica holds requests of at most "
                         f"{held}; {fix}")
    step = scenario.engine.whole_step_tokens(requests.input_tokens, requests.output_tokens)
    if step is not None:
        worst = int(np.argmax(step))
        if step[worst] > scenario.engine.max_num_batched_tokens:
            where = "engine.max_num_batched_tokens" if measured_in is None else measured_in
            beyond = "" if measured_in is None else ", more than the scenario's engine.max_num_batched_tokens"
            raise UserError(
                f"{where}: request {worst} needs {int(step[worst])} tokens in one step without chunked prefill"
                f"{beyond}; enable engine.chunked_prefill or raise max_num_batched_tokens"
            )
