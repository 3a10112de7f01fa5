"""SGLang: `python -m sglang.launch_server`, one server per pool with its replicas as --dp-size; a
prefill and a decode server (--disaggregation-mode) behind `sglang_router --pd-disaggregation`."""

from __future__ import annotations

from tokenpath.config.errors import UserError
from tokenpath.launch.command import Command, Settings, ShellVariable
from tokenpath.launch.flags import programs
from tokenpath.launch.hosts import HEAD_ADDR_VARIABLE, NODE_RANK, Hosts
from tokenpath.launch.plan import Plan, Role, weight_flags

# The engine's name: --engine's value, its table in flags.toml and Profile.launched_with.
NAME = __name__.rsplit(".", 1)[-1]
PROGRAM = programs()[NAME]["command"]
ROUTER = programs()["sglang-router"]["command"]
# One replica over several hosts: every host runs the same command but for its --node-rank, host 0 the
# HTTP server and the others their ranks' schedulers alone (Engine, sglang/srt/entrypoints/engine.py,
# _calculate_rank_ranges: each host an equal share of the TP and PP ranks), meeting at --dist-init-addr,
# an address and port of host 0 (the port of the flag's own example, arg_groups/fields/parallel.py).
DIST_INIT_PORT = 25000
DIST_INIT_ADDR = ShellVariable(HEAD_ADDR_VARIABLE, f":{DIST_INIT_PORT}")
# The KV transfer between the pools: SGLang's default backend, written out.
TRANSFER_BACKEND = "mooncake"
# The routing policies the scenario names -> SGLang's data-parallel load balancing (--load-balance-method):
# fewest requests, fewest tokens; prefix_aware is the router's cache_aware policy, not the server's.
LOAD_BALANCE = {"round_robin": "round_robin", "least_outstanding": "total_requests", "least_kv_load": "total_tokens"}
# The router's policy for disaggregated pools, which the simulation routes round-robin.
PD_POLICY = "round_robin"
# The scenario's routing over servers of their own -> sglang_router's --policy (router_args.py): prefix_aware
# is its cache_aware policy. It has none that picks the fewest outstanding requests or KV tokens; its
# power_of_two sends each request to the less loaded of two servers drawn at random.
ROUTER_POLICY = {"round_robin": "round_robin", "prefix_aware": "cache_aware"}
NEAREST_ROUTER_POLICY = "power_of_two"
# The CUDA-graph backends per phase: SGLang 0.5.23 captures decode batches ("full") and, on CUDA,
# prefill batches in breakable graphs by default (model_executor/cuda_graph_config.py); under "decode" the
# prefill backend is as simulated (Plan.prefill_graph_tokens, engine/cuda_graphs.py).
GRAPHS = {"none": ("disabled", "disabled"), "decode": ("full", "disabled"), "all": ("full", "breakable")}
PREFILL_GRAPHS = "breakable"
# The scenario's drafters -> --speculative-algorithm (arg_groups/fields/spec.py; NEXTN, a model's own MTP
# layers, runs as EAGLE over them, arg_groups/speculative_hook.py).
SPECULATIVE_ALGORITHM = {"mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM",
                         "draft_model": "STANDALONE"}


def server_per_replica(plan: Plan) -> bool:
    """Whether each replica needs a server of its own: with attention data-parallel SGLang refuses more than
    one replica in a server (sglang 0.5.23, arg_groups/parallel_hook.py, handle_data_parallelism: --dp-size
    above 1 with --attn-dp-size)."""
    return plan.scenario.deployment.attention_dp


def over_hosts(plan: Plan, layout: Hosts) -> bool:
    """Whether SGLang's rank ranges lay one replica over `layout`'s hosts as it is: whole PP stages a host,
    or each stage over an equal number of hosts that splits its TP ranks (_calculate_rank_ranges)."""
    pp, tp, count = plan.scenario.deployment.pp, plan.scenario.deployment.tp, layout.count
    return pp % count == 0 or (count % pp == 0 and tp % (count // pp) == 0)


def command(plan: Plan, role: Role, replicas: int, settings: Settings, host: str | None = None,
            port: int | None = None, bootstrap_port: int | None = None, layout: Hosts | None = None,
            rank: str = NODE_RANK, dist_init_addr: str = DIST_INIT_ADDR) -> Command:
    """`sglang.launch_server` for `replicas` replicas of `role` in one server; for one replica over the hosts
    of `layout`, each host's, its rank and host 0's address as `rank` and `dist_init_addr` give them (a
    script's NODE_RANK and HEAD_ADDR, or a pod's LeaderWorkerSet variables)."""
    s = plan.scenario
    dep, eng = s.deployment, s.engine
    cmd = Command(list(PROGRAM))
    cmd.add(settings, "model.name", "--model-path", plan.checkpoint.hf_id)
    cmd.add(settings, "deployment.tp", "--tp-size", dep.tp)
    cmd.add(settings, "deployment.pp", "--pp-size", dep.pp)
    cmd.add(settings, "deployment.chips", "--dp-size", replicas)
    if layout is not None and not layout.one:
        cmd.add(settings, "deployment.chips", "--nnodes", layout.count)
        cmd.add(None, None, "--node-rank", rank)
        cmd.add(None, None, "--dist-init-addr", dist_init_addr)
    if dep.expert_parallel:
        cmd.add(settings, "deployment.expert_parallel", "--ep-size", dep.tp)
    else:
        settings.map("deployment.expert_parallel", "(off: SGLang's default --ep-size 1)")
    if dep.moe_all_to_all:  # (its --deepep-mode auto: low-latency kernels for decode batches, as simulated)
        cmd.add(settings, "deployment.moe_all_to_all", "--moe-a2a-backend", "deepep")
    else:
        settings.map("deployment.moe_all_to_all", "(off: SGLang's default --moe-a2a-backend none)")
    if dep.attention_dp:
        cmd.add(settings, "deployment.attention_dp", "--attn-dp-size", dep.tp)
    else:
        settings.map("deployment.attention_dp", "(off: SGLang's default --attn-dp-size 1)")
    # SGLang quantizes bf16 weights to fp8 as it loads them
    weight_flags(plan, cmd, settings, "SGLang", "fp8")
    # bf16 written out: `auto` takes a quantized checkpoint's own KV scheme (kv_cache_quant_algo FP8: fp8;
    # configure_kv_cache_dtype, sglang/srt/mem_cache/kv_cache_dtype.py), not what was simulated
    kv_dtype = "fp8_e4m3" if plan.kv_precision == "fp8" else "bfloat16"
    cmd.add(settings, "model.kv_cache_precision", "--kv-cache-dtype", kv_dtype)
    if not eng.sets_own_running:
        cmd.add(settings, "engine.max_num_seqs", "--max-running-requests", eng.max_num_seqs)
    else:
        settings.map("engine.max_num_seqs", "(SGLang's own, set from its KV pool, as simulated: "
                                            "engine/batch_limits.py)")
    cmd.add(settings, "engine.chunked_prefill", "--chunked-prefill-size",
            eng.max_num_batched_tokens if eng.chunked_prefill else -1)
    cmd.add(settings, "engine.max_num_batched_tokens", "--max-prefill-tokens", eng.max_num_batched_tokens)
    if eng.chunked_prefill:
        settings.map("engine.max_num_batched_tokens", "--chunked-prefill-size")
    cmd.add(settings, "engine.block_size", "--page-size", eng.block_size)
    if eng.gpu_memory_utilization is not None:
        cmd.add(settings, "engine.gpu_memory_utilization", "--mem-fraction-static", eng.gpu_memory_utilization)
    else:
        settings.map("engine.gpu_memory_utilization", "(SGLang's own --mem-fraction-static for the GPU's memory and "
                                                      "the server's settings, as simulated: engine/memory_share.py)")
    settings.note("engine.gpu_memory_utilization", "for SGLang the share of GPU memory for the weights and the KV "
                                                   "pool (--mem-fraction-static); the activations and CUDA graphs "
                                                   "live in the rest")
    if eng.prefix_caching:
        settings.map("engine.prefix_caching", "(RadixAttention: SGLang's default)")
    else:
        cmd.add(settings, "engine.prefix_caching", "--disable-radix-cache")
    decode, prefill = GRAPHS[eng.cuda_graphs]
    if eng.cuda_graphs == "decode" and plan.prefill_graph_tokens is not None:
        prefill = PREFILL_GRAPHS
    cmd.add(settings, "engine.cuda_graphs", "--cuda-graph-backend-decode", decode)
    cmd.add(settings, "engine.cuda_graphs", "--cuda-graph-backend-prefill", prefill)
    if plan.prefill_graph_tokens is not None:
        cmd.add(settings, "engine.prefill_cuda_graphs", "--cuda-graph-max-bs-prefill", plan.prefill_graph_tokens)
    else:
        settings.map("engine.prefill_cuda_graphs", "(off: --cuda-graph-backend-prefill disabled)")
    if eng.cuda_graph_max_tokens is not None and eng.cuda_graphs != "none":
        cmd.add(settings, "engine.cuda_graph_max_tokens", "--cuda-graph-max-bs-decode", eng.cuda_graph_max_tokens)
    else:
        settings.map("engine.cuda_graph_max_tokens", "(SGLang's own limit for the GPU's memory)")
    if eng.nccl_nvls:
        cmd.add(settings, "engine.nccl_nvls", "--enable-nccl-nvls")
    else:
        settings.map("engine.nccl_nvls", "(off: SGLang sets NCCL_NVLS_ENABLE=0 without --enable-nccl-nvls)")
    _mixing(plan, cmd, settings)
    if plan.host_overlap:
        settings.map("engine.host_overlap", "(the overlap scheduler: SGLang's default)")
    else:
        cmd.add(settings, "engine.host_overlap", "--disable-overlap-schedule")
    _speculative(plan, cmd, settings)
    cmd.add(settings, "delivery.stream_interval", "--stream-interval", s.delivery.stream_interval)
    _routing(plan, cmd, settings, replicas)
    cmd.add(settings, "deployment.api_servers", "--tokenizer-worker-num",
            max(1, role.api_servers * replicas // role.replicas))
    if role.name != "server":
        cmd.add(settings, "deployment.prefill_replicas", "--disaggregation-mode", role.name)
        cmd.add(settings, "deployment.prefill_replicas", "--disaggregation-transfer-backend", TRANSFER_BACKEND)
        if bootstrap_port is not None:
            cmd.add(None, None, "--disaggregation-bootstrap-port", bootstrap_port)
    else:
        settings.map("deployment.prefill_replicas", "(none: every replica prefills and decodes)")
    if host is not None:
        cmd.add(None, None, "--host", host)
    if port is not None:
        cmd.add(None, None, "--port", port)
    _notes(plan, settings)
    return cmd


def worker_router(plan: Plan, urls: list[str], settings: Settings, host: str, port: int) -> Command:
    """The router in front of a pool's servers, one replica each (server_per_replica)."""
    routing = plan.scenario.deployment.routing
    cmd = Command(list(ROUTER))
    cmd.add(None, None, "--worker-urls", *urls)
    cmd.add(settings, "deployment.routing", "--policy", ROUTER_POLICY.get(routing, NEAREST_ROUTER_POLICY))
    if routing not in ROUTER_POLICY:
        settings.note("deployment.routing", f"sglang_router has no {routing} policy; {NEAREST_ROUTER_POLICY} sends "
                                             "each request to the less loaded of two servers drawn at random")
    cmd.add(None, None, "--host", host)
    cmd.add(None, None, "--port", port)
    return cmd


def router(plan: Plan, prefill_urls: list[tuple[str, int]], decode_urls: list[str], settings: Settings,
           host: str, port: int) -> Command:
    """The router in front of disaggregated pools: each prefill server with its bootstrap port."""
    cmd = Command(list(ROUTER))
    cmd.add(settings, "deployment.prefill_replicas", "--pd-disaggregation")
    for url, bootstrap in prefill_urls:
        cmd.add(None, None, "--prefill", url, bootstrap)
    for url in decode_urls:
        cmd.add(None, None, "--decode", url)
    cmd.add(settings, "deployment.routing", "--policy", PD_POLICY)
    cmd.add(None, None, "--host", host)
    cmd.add(None, None, "--port", port)
    return cmd


def _mixing(plan: Plan, cmd: Command, settings: Settings) -> None:
    """Decodes joining prompt steps: SGLang's --enable-mixed-chunk, with chunked prefill only."""
    eng = plan.scenario.engine
    if eng.prefills_alone:
        settings.map("engine.mixed_chunk", "(off: SGLang's default)")
    elif eng.speculative is not None:
        settings.note("engine.mixed_chunk", "the scenario mixes prompts with decodes; SGLang turns "
                                            "--enable-mixed-chunk off under speculative decoding")
    elif eng.chunked_prefill:
        cmd.add(settings, "engine.mixed_chunk", "--enable-mixed-chunk")
    else:
        settings.note("engine.mixed_chunk", "the scenario mixes whole prompts with decodes; SGLang mixes them only "
                                            "with chunked prefill (--enable-mixed-chunk)")


def _speculative(plan: Plan, cmd: Command, settings: Settings) -> None:
    """The drafter as SGLang's --speculative-* flags: k drafts a step in a chain (top-k 1), so k + 1
    draft tokens with the verified one; an EAGLE head's checkpoint is the user's to add."""
    eng = plan.scenario.engine
    speculative = eng.speculative
    if speculative is None:
        settings.map("engine.speculative", "(none)")
        return
    if speculative.method == "ngram" and plan.scenario.deployment.attention_dp:
        raise UserError("engine.speculative: SGLang drafts no n-grams with attention data-parallel (sglang 0.5.23, "
                        "arg_groups/speculative_hook.py refuses it); set deployment.attention_dp = false or draft "
                        "with mtp or eagle3")
    k = speculative.num_speculative_tokens
    cmd.add(settings, "engine.speculative", "--speculative-algorithm", SPECULATIVE_ALGORITHM[speculative.method])
    if speculative.method == "ngram":  # its tree's breadth stands for the top-k: 1 for a chain
        cmd.add(settings, "engine.speculative", "--speculative-ngram-max-bfs-breadth", 1)
    else:
        cmd.add(settings, "engine.speculative", "--speculative-num-steps", k)
        cmd.add(settings, "engine.speculative", "--speculative-eagle-topk", 1)
    cmd.add(settings, "engine.speculative", "--speculative-num-draft-tokens", k + 1)
    if speculative.method in ("eagle", "eagle3"):
        settings.note("engine.speculative", f"add --speculative-draft-model-path with the {speculative.method.upper()} "
                                            f"head's checkpoint (one trained for {plan.checkpoint.hf_id}): SGLang "
                                            "needs it for an EAGLE algorithm")
    elif speculative.method == "draft_model" and plan.draft is not None:
        cmd.add(settings, "engine.speculative", "--speculative-draft-model-path", plan.draft.hf_id)
    elif speculative.method == "draft_model":
        settings.note("engine.speculative", f"the draft model {speculative.draft_model} has no Hugging Face id: add "
                                            "--speculative-draft-model-path with its checkpoint")


def _routing(plan: Plan, cmd: Command, settings: Settings, replicas: int) -> None:
    routing = plan.scenario.deployment.routing
    if plan.disaggregated:
        return  # the router's --policy
    if replicas == 1:
        settings.map("deployment.routing", "(one replica per server)")
    elif routing in LOAD_BALANCE:
        cmd.add(settings, "deployment.routing", "--load-balance-method", LOAD_BALANCE[routing])
    else:
        settings.note("deployment.routing", f"SGLang's server balances its --dp-size replicas by requests or tokens; "
                                             f"{routing} is sglang_router's cache_aware policy over separate "
                                             "servers, not emitted here")


def _notes(plan: Plan, settings: Settings) -> None:
    eng = plan.scenario.engine
    settings.map("engine.cuda_graph_padding", "(SGLang pads a batch up to the next size it captured)")
    if eng.eager_host is False:
        settings.note("engine.eager_host", "no flag: SGLang's model code runs in Python, which launches a step's "
                                           "kernels where it replays no CUDA graph")
    else:
        settings.map("engine.eager_host", "(SGLang's own launches)")
    if eng.kv_admission == "reserve":
        settings.note("engine.kv_admission", "SGLang takes KV pages as sequences grow; it cannot reserve a "
                                             "request's whole cache at admission")
    else:
        settings.map("engine.kv_admission", "(SGLang's own)")
    if eng.num_scheduler_steps > 1:
        settings.note("engine.num_scheduler_steps", "SGLang has no multi-step scheduling")
    else:
        settings.map("engine.num_scheduler_steps", "(one step per scheduler call)")
    if plan.detokenizes_in == "detokenizer":
        settings.map("delivery.detokenize", "(SGLang's detokenizer process)")
    else:
        settings.note("delivery.detokenize", f"SGLang detokenizes in a process of its own; the scenario in the "
                                             f"{plan.detokenizes_in} process")
