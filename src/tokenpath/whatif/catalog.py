"""The catalog of what-ifs: for one scenario, each lever a real set of dotted-key overrides, in four
groups (the test a design must pass: wider links, a closer path from token to text, output that flows
more continuously, and the compute itself). A lever that does not apply carries the reason instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.compute.model_spec import ModelSpec
from tokenpath.delivery.spec import DeliverySpec
from tokenpath.engine.profiles import PROFILES
from tokenpath.engine.release import release_at_least
from tokenpath.engine.speculative import MAX_SPECULATIVE_TOKENS
from tokenpath.fabric.build import scaleup_link_bw_Bps
from tokenpath.fabric.spec import HierarchyFabric, SwitchFabric
from tokenpath.sim import front_end
from tokenpath.sim.deployment import build_deployment, gives_fabric, simulated_fabric
from tokenpath.sim.scenario import DeploymentSection, Scenario

GROUPS = ("wider", "closer", "more continuous", "compute")
# A fifth group, only for scenarios with an [application] table: the stages around the model call.
APPLICATION_GROUP = "value parallel"

# The next generation of each catalog chip from the same vendor (NVIDIA: Ampere A100 -> Hopper H100
# -> H200, its HBM3e refresh -> Blackwell B200 -> GB200 NVL72; AMD: MI300X -> MI325X, its HBM3e
# refresh). Chips without one here have no successor in the catalog.
NEXT_CHIP = {"a100": "h100", "h100": "h200", "h200": "b200", "b200": "gb200", "mi300x": "mi325x"}
NEXT_PRECISION = {"bf16": "fp8", "fp8": "fp4"}
# `tokenpath calibrate delivery` writes this file in the folder it runs in (cli/calibrate.py).
CALIBRATION_FILE = "delivery-calibration.toml"
BANDWIDTH_FACTOR = 2.0       # "interconnect bandwidth x2", "a faster scale-out network"
RTT_DIVISOR = 4              # "the client closer": a quarter of the round trip
STREAM_INTERVAL = 4          # tokens per SSE event, the what-if against one per token
PREFILL_SHARE = 4            # disaggregated: a quarter of the replicas prefill (at least one)
API_SERVER_FACTOR = 2        # "API servers x2"
# "cache retrieval and reranking": the what-if's hit rate, and a hit's time (a lookup in a cache beside the
# application).
CACHE_HIT_RATE = 0.5
CACHE_HIT_LATENCY = "1 ms"
# "HNSW instead of a flat scan": USearch's defaults, M 16 and ef 64 at search (its BENCHMARKS.md lists them
# beside hnswlib's 16 / 10 and FAISS's 32 / 16); FAISS reaches R@1 0.978 on SIFT1M at efSearch 64.
HNSW_LEVER_M = 16
HNSW_LEVER_EF_SEARCH = 64
# "rerank on CPU cores": the cores of one GPU server's host, a DGX H100/H200's two 56-core Xeon Platinum
# 8480C (NVIDIA DGX H100/H200 user guide, "Hardware Overview").
HOST_CPU_CORES = 112
# "a faster tokenizer": tiktoken's encoder ran 1.7x HF tokenizers' single-threaded on the same text
# (10.6M against 6.3M bytes/s, openai/tiktoken pull request 531).
TOKENIZER_SPEEDUP = 1.7


@dataclass(frozen=True)
class Lever:
    """One what-if: a name, its group, the overrides that make it, or why it does not apply."""

    name: str
    group: str
    overrides: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None


def running_requests(scenario: Scenario) -> int:
    """The most sequences the scenario's engine runs at once: its [engine] max_num_seqs, or what the
    profile sets from the deployment's KV cache where the table leaves it out (SGLang's)."""
    if not scenario.engine.sets_own_running:
        return scenario.engine.max_num_seqs
    return build_deployment(scenario).engine.max_num_seqs


def padded_graphs(max_num_seqs: int) -> dict[str, Any]:
    """The overrides that replay every decode batch up to `max_num_seqs` as a CUDA graph, padded, as
    TensorRT-LLM's deployment guides set its cuda_graph_config: a lever here, and how `tokenpath search`
    launches an engine that starts without them (layouts.launch_tuning)."""
    return {"engine.cuda_graph_padding": True, "engine.cuda_graph_max_tokens": max_num_seqs}


def _gbps(bw_Bps: float) -> str:
    return f"{bw_Bps / 1e9:.6g} GB/s"


class _Fabric:
    """The scenario's fabric as simulated (its own, or the chip's default), and the overrides that
    change one part of it: leaf keys where they reach the change, else the whole table."""

    def __init__(self, scenario: Scenario, table: dict[str, Any]) -> None:
        dep = scenario.deployment
        self.chip = load_chip(dep.chip)
        self.chips = dep.chips
        self.is_default = not gives_fabric(dep.fabric)
        self.spec = simulated_fabric(scenario, self.chip)[0]
        raw = table.get("deployment", {}).get("fabric") if isinstance(table.get("deployment"), dict) else None
        self.raw_is_table = isinstance(raw, dict) and "preset" not in raw

    @property
    def scaleup(self) -> Any:
        return self.spec.node if isinstance(self.spec, HierarchyFabric) else self.spec

    def overrides(self, path: tuple[str, ...], value: Any) -> dict[str, Any]:
        """Overrides that set `path` (inside the fabric table) to `value` in the fabric as simulated."""
        dumped = self.spec.model_dump(mode="json", exclude_none=True)
        target = dumped
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        if self.raw_is_table and not self.is_default:
            return {"deployment.fabric." + ".".join(path): value}
        return {"deployment.fabric": dumped}


def catalog(scenario: Scenario, table: dict[str, Any], here: Path | None = None) -> list[Lever]:
    """Every lever of the catalog for `scenario` (its raw `table` decides how overrides are written);
    `here` is where a delivery calibration file is looked for (default: the current folder)."""
    levers: list[Lever] = []
    for group, make in _MAKERS:
        for lever in make(scenario, table, here or Path.cwd()):
            levers.append(Lever(lever.name, group, lever.overrides, lever.skipped))
    return levers


def _wider(scenario: Scenario, table: dict[str, Any], here: Path) -> list[Lever]:
    dep = scenario.deployment
    fabric = _Fabric(scenario, table)
    up, inside = fabric.scaleup, (("node",) if isinstance(fabric.spec, HierarchyFabric) else ())
    levers = []
    bw = scaleup_link_bw_Bps(up, fabric.chip.scaleup_bw_Bps, dep.chips)
    if dep.tp == 1 and dep.pp == 1 and not dep.prefill_replicas:
        # Every replica on a chip of its own: no collective, hand-off or KV cache crosses the fabric.
        idle = "each replica runs on one chip (tp = 1, pp = 1, not disaggregated): nothing crosses the fabric"
        levers += [Lever("scale-up links", "", skipped=idle), Lever("NVLS", "", skipped=idle)]
    else:
        levers.append(Lever(f"scale-up links x{BANDWIDTH_FACTOR:g} ({_gbps(bw * BANDWIDTH_FACTOR)})", "",
                            fabric.overrides((*inside, "link_bw"), _gbps(bw * BANDWIDTH_FACTOR))))
        if isinstance(up, SwitchFabric):
            levers.append(_nvls(scenario, fabric, up.nvls, inside))
        else:
            levers.append(Lever("NVLS", "",
                                skipped=f"NVLink SHARP reduces in a switch; this scale-up fabric is a {up.kind}"))
    group = dep.tp * dep.pp
    levers.append(Lever(f"one more replica ({dep.chips + group} chips)", "", {"deployment.chips": dep.chips + group}))
    for divisor in (2, 4):
        tp = dep.tp // divisor
        name = f"TP{dep.tp} -> TP{tp}x{dep.chips // max(1, tp * dep.pp)}" if tp else f"TP{dep.tp} / {divisor}"
        if dep.tp % divisor:
            levers.append(Lever(name, "", skipped=f"tp={dep.tp} does not divide by {divisor}"))
        else:  # (one chip has no attention to share out; each pool keeps its chips, in narrower replicas)
            levers.append(Lever(name, "", {"deployment.tp": tp, **({"deployment.attention_dp": False}
                                                                   if dep.attention_dp and tp == 1 else {}),
                                           **({"deployment.prefill_replicas": dep.prefill_replicas * divisor}
                                              if dep.prefill_replicas else {})}))
    model = load_model(scenario.model_source())
    name = f"attention data-parallel {'off' if dep.attention_dp else 'on'}"
    refusal = None if dep.attention_dp else scenario.engine.profile.attention_dp_refusal(
        model.is_moe, model.architecture)
    if dep.tp == 1 or dep.pp > 1:
        levers.append(Lever(name, "", skipped="attention is data-parallel over a replica's tp > 1 chips, pp = 1"))
    elif refusal:
        levers.append(Lever(name, "", skipped=refusal))
    else:
        levers.append(Lever(name, "", {"deployment.attention_dp": not dep.attention_dp}))
    levers.extend(_experts(scenario, model))
    if isinstance(fabric.spec, HierarchyFabric):
        net = fabric.spec.network.link_bw
        levers.append(Lever(f"scale-out network x{BANDWIDTH_FACTOR:g} ({_gbps(net * BANDWIDTH_FACTOR)} per link)", "",
                            fabric.overrides(("network", "link_bw"), _gbps(net * BANDWIDTH_FACTOR))))
    else:
        levers.append(Lever("faster scale-out network", "",
                            skipped=f"one {fabric.spec.kind} joins all {dep.chips} chips: "
                                    "no scale-out network in the path"))
    return levers


def _experts(scenario: Scenario, model: ModelSpec) -> list[Lever]:
    """Expert parallel on or off, and with it DeepEP's all-to-alls on or off, where the engine runs them."""
    dep, profile = scenario.deployment, scenario.engine.profile
    name = f"expert parallel {'off' if dep.expert_parallel else 'on'}"
    if not model.is_moe:
        return [Lever(name, "", skipped=f"{model.name} has no experts")]
    if dep.pp > 1:
        return [Lever(name, "", skipped="expert parallel is modelled with pp = 1")]
    if dep.tp == 1:
        return [Lever(name, "", skipped="experts spread over a replica's chips, and each replica has one (tp = 1)")]
    levers = [Lever(name, "", {"deployment.expert_parallel": not dep.expert_parallel,
                               **({"deployment.moe_all_to_all": False} if dep.moe_all_to_all else {})})]
    name = f"DeepEP all-to-alls {'off' if dep.moe_all_to_all else 'on'}"
    refusal = profile.all_to_all_refusal(dep.tp, model.experts_per_token)
    if not dep.expert_parallel:
        levers.append(Lever(name, "", skipped="the experts are not spread over the chips (expert parallel off)"))
    elif refusal and not dep.moe_all_to_all:
        levers.append(Lever(name, "", skipped=refusal))
    else:
        levers.append(Lever(name, "", {"deployment.moe_all_to_all": not dep.moe_all_to_all}))
    return levers


def _nvls(scenario: Scenario, fabric: _Fabric, switch_nvls: bool, inside: tuple[str, ...]) -> Lever:
    """NVLink SHARP off where the switch reduces and the engine's NCCL uses it; else on: the switch's, and
    the engine's NCCL let use it (SGLang's is not, unless --enable-nccl-nvls: engine/profiles.py). Not on a
    chip whose switches cannot reduce (the catalog's `scaleup.nvls = false`: A100's NVSwitch, TPU's ICI)."""
    if switch_nvls and scenario.engine.nccl_nvls:
        return Lever("NVLS off", "", fabric.overrides((*inside, "nvls"), False))
    if not switch_nvls and fabric.chip.scaleup.get("nvls", True) is False:
        return Lever("NVLS on", "", skipped=f"the {fabric.chip.name}'s scale-up switches do not reduce in the "
                                             "network (catalog chips.toml: scaleup nvls = false)")
    overrides = {} if switch_nvls else fabric.overrides((*inside, "nvls"), True)
    if not scenario.engine.nccl_nvls:
        overrides["engine.nccl_nvls"] = True
    return Lever("NVLS on", "", overrides)


def _closer(scenario: Scenario, table: dict[str, Any], here: Path) -> list[Lever]:
    # the last mile as the scenario runs it: its [assumptions] and calibration under its [delivery] table
    delivery, dep = scenario.resolved_delivery(), scenario.deployment
    levers = _front_end(scenario, delivery)
    calibration = here / CALIBRATION_FILE
    if delivery.calibration is not None:
        levers.append(Lever("this machine's last mile", "", skipped="the scenario uses a measured calibration already"))
    elif calibration.is_file():
        levers.append(Lever("this machine's last mile", "", {"delivery.calibration": str(calibration.resolve())}))
    else:
        levers.append(Lever("this machine's last mile", "", skipped=f"no {CALIBRATION_FILE} here: run `tokenpath "
                                                                  "calibrate delivery` first"))
    if delivery.network_rtt > 0:
        rtt_ms = delivery.network_rtt / RTT_DIVISOR * 1e3
        levers.append(Lever(f"client closer (RTT / {RTT_DIVISOR}: {rtt_ms:.4g} ms)", "",
                            {"delivery.network_rtt": f"{rtt_ms:.6g} ms"}))
    else:
        levers.append(Lever("client closer", "", skipped="the client's round trip is 0 already"))
    if dep.prefill_replicas:
        levers.append(Lever("disaggregated prefill", "", skipped="the scenario is disaggregated already"))
    elif dep.replicas < 2:
        levers.append(Lever("disaggregated prefill", "", skipped=_one_replica(dep)))
    else:
        prefill = max(1, dep.replicas // PREFILL_SHARE)
        levers.append(Lever(f"disaggregated prefill ({prefill} of {dep.replicas} replicas)", "",
                            {"deployment.prefill_replicas": prefill}))
    if scenario.engine.prefix_caching:
        levers.append(Lever("prefix caching", "", skipped="the scenario caches prefixes already"))
    else:
        levers.append(Lever("prefix caching", "", {"engine.prefix_caching": True}))
    levers.append(_prefix_aware_routing(scenario))
    return levers


def _front_end(scenario: Scenario, delivery: DeliverySpec) -> list[Lever]:
    """The front end's levers (delivery/frontend.py), each from the cost the scenario runs with (`delivery`,
    resolved): more API-server processes, detokenizing out of the engine's process, token ids to the client
    (it detokenizes), a faster tokenizer, a cached chat template, and where the engine's release parses the
    template's source per request, a release that parses it once, or holds prompts for a tokenizer batch, one
    that does not."""
    servers = front_end.api_servers(scenario)
    levers = [Lever(f"API servers x{API_SERVER_FACTOR} ({servers * API_SERVER_FACTOR} processes)", "",
                    {"deployment.api_servers": servers * API_SERVER_FACTOR})]
    where = front_end.detokenizes_in(scenario)
    if where == "engine":
        levers.append(Lever("detokenize in a process of its own", "", {"delivery.detokenize": "detokenizer"}))
    else:
        levers.append(Lever("detokenize in a process of its own", "",
                            skipped=f"the engine's steps do not wait for it already: it detokenizes in the {where}"))
    if delivery.calibration is not None:
        levers.append(Lever("token ids to the client", "",
                            skipped="the scenario's calibration measures the whole path; set detokenize_per_token"))
    elif delivery.detokenize_per_token:
        levers.append(Lever("token ids to the client (it detokenizes)", "", {"delivery.detokenize_per_token": "0 s"}))
    else:
        levers.append(Lever("token ids to the client", "", skipped="the server spends nothing detokenizing already"))
    if delivery.tokenize_per_token:
        faster = delivery.tokenize_per_token / TOKENIZER_SPEEDUP
        levers.append(Lever(f"tokenizer x{TOKENIZER_SPEEDUP} faster", "",
                            {"delivery.tokenize_per_token": f"{faster * 1e9:.6g} ns"}))
    else:
        levers.append(Lever("faster tokenizer", "", skipped="tokenizing costs nothing already"))
    if delivery.chat_template_per_request:
        levers.append(Lever("cached chat template", "", {"delivery.chat_template_per_request": "0 s"}))
    else:
        levers.append(Lever("cached chat template", "", skipped="rendering the chat template costs nothing already"))
    if delivery.chat_template_parse_per_request:  # a release that parses it per request
        levers.append(Lever("chat template parsed once (a vLLM release that caches it)", "",
                            {"delivery.chat_template_parse_per_request": "0 s"}))
    if delivery.tokenizer_batch_wait:  # a release that holds prompts for a tokenizer batch
        levers.append(Lever("prompts tokenized without a batch wait (vLLM 0.24.0 on)", "",
                            {"delivery.tokenizer_batch_wait": "0 s"}))
    return levers


def _one_replica(dep: DeploymentSection) -> str:
    """Why a lever that needs replicas to choose between does not apply: the layout has one."""
    layout = f"TP{dep.tp}" + (f" x PP{dep.pp}" if dep.pp > 1 else "")
    return f"needs 2 or more replicas; {layout} on {dep.chips} chips is {dep.replicas}"


def _prefix_aware_routing(scenario: Scenario) -> Lever:
    dep, name = scenario.deployment, "prefix-aware routing"
    if dep.routing == "prefix_aware":
        return Lever(name, "", skipped="the scenario routes by cached prefix already")
    if dep.replicas < 2:
        return Lever(name, "", skipped=_one_replica(dep))
    if dep.prefill_replicas:
        return Lever(name, "", skipped="disaggregated serving routes round-robin only")
    if not scenario.engine.prefix_caching:
        return Lever(name, "", skipped="the engine does not cache prefixes (see the prefix caching lever)")
    return Lever(name, "", {"deployment.routing": "prefix_aware"})


def _continuous(scenario: Scenario, table: dict[str, Any], here: Path) -> list[Lever]:
    engine, interval = scenario.engine, scenario.delivery.stream_interval
    target = STREAM_INTERVAL if interval == 1 else 1
    levers = [Lever(f"stream interval {target} token(s)/event", "", {"delivery.stream_interval": target})
              if engine.speculative is None else
              Lever("stream interval", "", skipped="speculative decoding streams each step's tokens as one event")]
    budget = engine.max_num_batched_tokens
    levers.append(Lever(f"token budget {budget * 2}/step", "", {"engine.max_num_batched_tokens": budget * 2}))
    levers.append(Lever(f"token budget {budget // 2}/step", "", {"engine.max_num_batched_tokens": budget // 2}))
    running = running_requests(scenario)
    for seqs in (running // 4, running * 2):
        overrides: dict[str, Any] = {"engine.max_num_seqs": seqs}
        if seqs > budget:  # vLLM needs a token per running sequence in every step
            overrides["engine.max_num_batched_tokens"] = seqs
        levers.append(Lever(f"max_num_seqs {seqs}", "", overrides) if seqs >= 1 else
                      Lever("max_num_seqs / 4", "", skipped=f"max_num_seqs is {running}"))
    if engine.chunked_prefill:
        levers.append(Lever("chunked prefill", "", skipped="the engine chunks long prompts already"))
    elif engine.num_scheduler_steps > 1:
        levers.append(Lever("chunked prefill", "", skipped="multi-step scheduling runs without it"))
    else:  # a long prompt no longer holds up its step's decodes (TensorRT-LLM starts without it)
        levers.append(Lever("chunked prefill", "", {"engine.chunked_prefill": True}))
    if engine.speculative is not None:  # how many drafts a step pays off at the workload's acceptance
        k = engine.speculative.num_speculative_tokens
        for drafts in (k + 1, k - 1):
            name = f"{drafts} speculative drafts a step"
            levers.append(Lever(name, "", {"engine.speculative.num_speculative_tokens": drafts})
                          if 1 <= drafts <= MAX_SPECULATIVE_TOKENS else
                          Lever(name, "", skipped=f"num_speculative_tokens is {k}"))
    for profile, facts in PROFILES.items():
        if profile != engine.scheduler and facts.offered_as_lever:
            overrides = {"engine.scheduler": profile}
            if engine.num_scheduler_steps > 1:
                overrides["engine.num_scheduler_steps"] = 1
            if engine.mixed_chunk:
                overrides["engine.mixed_chunk"] = False
            levers.append(Lever(f"scheduler {profile}", "", overrides))
    return levers


def _compute(scenario: Scenario, table: dict[str, Any], here: Path) -> list[Lever]:
    chip, precision, engine = scenario.deployment.chip, scenario.model.precision, scenario.engine
    levers = []
    name = "CUDA graphs for every decode batch"
    if engine.cuda_graphs == "none":
        levers.append(Lever(name, "", skipped="the engine runs without CUDA graphs"))
    elif engine.cuda_graph_padding:
        levers.append(Lever(name, "", skipped="decode batches are padded to a graph already"))
    else:
        levers.append(Lever(f"{name} up to {engine.max_num_seqs} (padded)", "", padded_graphs(engine.max_num_seqs)))
    levers.append(_prompt_graphs(scenario))
    nxt = NEXT_CHIP.get(chip)
    levers.append(Lever(f"next chip: {nxt}", "", {"deployment.chip": nxt}) if nxt else
                  Lever("next chip", "", skipped=f"no successor of {chip} in the catalog"))
    better = NEXT_PRECISION.get(precision)
    if better is None:
        levers.append(Lever("next precision", "", skipped=f"{precision} weights are the lowest precision modelled"))
    else:
        weight_only = " (weight-only on this chip)" if load_chip(chip).is_weight_only(better) else ""
        levers.append(Lever(f"{better} weights{weight_only}", "", {"model.precision": better}))
    return levers


def _prompt_graphs(scenario: Scenario) -> Lever:
    """Prompt steps replayed as CUDA graphs, where the engine can replay them apart from its decode graphs
    (SGLang's, engine/cuda_graphs.py) and the scenario's release or server leaves them off."""
    name, engine = "CUDA graphs for prompt steps", scenario.engine
    since = engine.profile.prefill_graphs_since
    if engine.profile.prefill_graphs is None:
        steps = "every step replays a graph already" if engine.cuda_graphs == "all" else \
            f"{engine.profile.engine} runs a step holding a prompt eagerly"
        return Lever(name, "", skipped=steps)
    if engine.cuda_graphs == "none":
        return Lever(name, "", skipped="the engine runs without CUDA graphs")
    if since is not None and not release_at_least(engine.version, since):
        return Lever(name, "", skipped=f"{engine.profile.engine} replays prompt steps from {since}; the scenario "
                                       f"runs {engine.version}")
    tokens = build_deployment(scenario).compute.prefill_graph_max_tokens
    if tokens is not None:
        return Lever(name, "", skipped=f"prompt steps of up to {tokens} tokens replay a graph already")
    return Lever(name, "", {"engine.prefill_cuda_graphs": True})


def _value_parallel(scenario: Scenario, table: dict[str, Any], here: Path) -> list[Lever]:
    """The application's stages (docs/application.md): only where the scenario has an [application]."""
    app = scenario.application
    if app is None:
        return []
    stages = app.model_dump(mode="json", exclude_none=True)["stages"]
    before = app.before_model()
    retrieval = [stage for stage in stages if stage["kind"] == "retrieval"]
    levers = []
    name = "start retrieval ahead"
    heads = [stage.ahead for stage in app.stages if stage.start == "ahead"]
    behind = [stage for stage in retrieval if stage["name"] in before and stage["start"] != "ahead"]
    if not retrieval:
        levers.append(Lever(name, "", skipped="the application has no retrieval stage"))
    elif not behind:
        levers.append(Lever(name, "", skipped="every retrieval stage before the model starts ahead already"))
    elif not heads:
        levers.append(Lever(name, "", skipped="no stage starts ahead, so the scenario gives no head start to take"))
    else:  # the retrieval and what it needs (the question's embedding) run on the typed text so far
        moved = {stage["name"] for stage in behind} | {a for stage in behind for a in app.waits_for(stage["name"])}
        head = max(heads)
        changed = [{**stage, "start": "ahead", "ahead": f"{head * 1e3:.6g} ms"} if stage["name"] in moved else stage
                   for stage in stages]
        levers.append(Lever(f"{name} ({', '.join(sorted(moved))}: {head * 1e3:.4g} ms)", "",
                            {"application.stages": changed}))
    levers.append(_cache(stages))
    levers.append(_parallel(stages))
    levers.append(_fewer_turns(stages))
    levers.append(_stream_into_next(stages))
    return levers + _index_levers(scenario, stages) + _served_moves(scenario, stages)


def _served_moves(scenario: Scenario, stages: list[dict[str, Any]]) -> list[Lever]:
    """Each stage served by a model moved: onto the deployment's GPU, or off it to the CPU cores of a host
    or to a chip of its own (the deployment's kind) (docs/application.md, "Stages served by a model")."""
    served = [stage for stage in stages if "served" in stage]
    if not served:
        return [Lever("move a served stage", "", skipped="no stage is served by a model (served = {...})")]
    chip = scenario.deployment.chip
    levers = []
    for stage in served:
        name, on = stage["name"], stage["served"]["on"]
        kept = {k: v for k, v in stage["served"].items() if k not in ("on", "cores", "max_batch")}
        batch = {"max_batch": stage["served"]["max_batch"]} if "max_batch" in stage["served"] else {}
        moves = ((f"{name} on the model's GPU", "shared", {**kept, "on": "shared", **batch}),
                 (f"{name} on {HOST_CPU_CORES} CPU cores", "cpu", {**kept, "on": "cpu", "cores": HOST_CPU_CORES}),
                 (f"{name} on a {chip} of its own", chip, {**kept, "on": chip, **batch}))
        for title, where, table in moves:
            if on == where:
                levers.append(Lever(title, "", skipped=f"stage {name!r} runs there already"))
                continue
            changed = [{**s, "served": table} if s["name"] == name else s for s in stages]
            levers.append(Lever(title, "", {"application.stages": changed}))
    return levers


def _cache(stages: list[dict[str, Any]]) -> Lever:
    """"cache retrieval and reranking": a result cache (CACHE_HIT_RATE hits) in front of each retrieval
    and rerank stage that has none; a reranker served by a model takes none (spec.py)."""
    name = f"cache retrieval and reranking ({CACHE_HIT_RATE:.0%} hits)"
    cacheable = [stage for stage in stages if stage["kind"] in ("retrieval", "rerank") and "served" not in stage]
    uncached = [stage["name"] for stage in cacheable if "cache" not in stage]
    if not uncached:
        return Lever(name, "", skipped="every retrieval and rerank stage has a cache already" if cacheable else
                     "the application has no retrieval or rerank stage timed by a latency or an index")
    cache = {"hit_rate": CACHE_HIT_RATE, "hit_latency": CACHE_HIT_LATENCY}
    changed = [{**stage, "cache": cache} if stage["name"] in uncached else stage for stage in stages]
    return Lever(f"cache {', '.join(uncached)} ({CACHE_HIT_RATE:.0%} hits)", "", {"application.stages": changed})


def _parallel(stages: list[dict[str, Any]]) -> Lever:
    """"run independent stages in parallel": each stage after only what it needs (its `needs`), where
    that leaves a valid table (every stage still before or after the model call)."""
    from pydantic import ValidationError

    from tokenpath.application.spec import ApplicationSpec

    name = "run independent stages in parallel"
    ordered = [k for k, stage in enumerate(stages) if set(stage.get("needs", stage["after"])) != set(stage["after"])]
    if not ordered:
        return Lever(name, "", skipped="no stage runs after one it does not need (a stage's needs, where set, "
                                       "say which of its after it uses)")
    changed, freed = list(stages), []
    for k in ordered:
        trial = [*changed[:k], {**changed[k], "after": changed[k]["needs"]}, *changed[k + 1:]]
        try:
            ApplicationSpec.model_validate({"stages": trial})
        except ValidationError:
            continue  # without that order the stage would be neither before nor after the model call
        changed, freed = trial, [*freed, stages[k]["name"]]
    if not freed:
        return Lever(name, "", skipped="each stage's order is what keeps it before or after the model call")
    return Lever(f"{name} ({', '.join(freed)})", "", {"application.stages": changed})


def _fewer_turns(stages: list[dict[str, Any]]) -> Lever:
    """One model call fewer per request (application/loop.py): the loop's count one lower, or its
    distribution's mean (a fixed one's value) one lower, the rest of its shape kept: a tool round the
    agent no longer needs (a better plan, tools merged into one call)."""
    name = "fewer agent turns"
    model = next(stage for stage in stages if stage["kind"] == "model")
    if "loop" not in model:
        return Lever(name, "", skipped="the model stage has no loop: one call per request")
    turns = model["loop"]["turns"]
    if isinstance(turns, dict) and turns["kind"] not in ("fixed", "normal", "lognormal", "uniform"):
        return Lever(name, "", skipped=f"its turns are drawn as {turns['kind']} lengths, with no mean to lower")
    key = None if isinstance(turns, int) else "value" if turns["kind"] == "fixed" else "mean"
    now = turns if key is None else turns[key]
    if now < 2:
        return Lever(name, "", skipped="each request makes one model call already")
    fewer = now - 1 if key is None else {**turns, key: now - 1, "min": min(turns.get("min", 1), max(1, int(now - 1)))}
    label = f"{'' if key is None else key + ' '}{now:g} -> {now - 1:g} calls"
    changed = [{**stage, "loop": {**stage["loop"], "turns": fewer}} if stage is model else stage for stage in stages]
    return Lever(f"{name} ({label})", "", {"application.stages": changed})


def _stream_into_next(stages: list[dict[str, Any]]) -> Lever:
    """The stages after the model start on its answer's first token, not its last (application/stream.py)."""
    name = "stream the answer into the stages after it"
    model = next(stage for stage in stages if stage["kind"] == "model")
    if not any(model["name"] in stage["after"] for stage in stages):
        return Lever(name, "", skipped="no stage runs after the model call")
    if model["stream_into_next"]:
        return Lever(name, "", skipped="the model streams into the stages after it already")
    changed = [{**stage, "stream_into_next": True} if stage is model else stage for stage in stages]
    return Lever(name, "", {"application.stages": changed})


def _index_levers(scenario: Scenario, stages: list[dict[str, Any]]) -> list[Lever]:
    """A retrieval index searched another way: an HNSW graph instead of a flat scan on the CPU, and the
    scan (flat or IVF) on the deployment's chip instead of the CPU (compute/vector_search.py)."""
    on_cpu = {stage["name"]: stage["index"] for stage in stages
              if "index" in stage and stage["index"].get("on", "cpu") == "cpu"}
    levers = []
    hnsw = {"method": "hnsw", "m": HNSW_LEVER_M, "ef_search": HNSW_LEVER_EF_SEARCH}
    flat = sorted(name for name, index in on_cpu.items() if index["method"] == "flat")
    levers.append(_index_lever(f"HNSW instead of a flat scan (M {HNSW_LEVER_M}, ef {HNSW_LEVER_EF_SEARCH})", stages,
                               flat, hnsw, "no retrieval stage scans a flat index on the CPU"))
    chip = scenario.deployment.chip
    scans = sorted(name for name, index in on_cpu.items() if index["method"] != "hnsw")
    levers.append(_index_lever(f"retrieval on the {chip}", stages, scans, {"on": chip},
                               "no retrieval stage scans a flat or IVF index on the CPU"))
    return levers


def _index_lever(name: str, stages: list[dict[str, Any]], moved: list[str], change: dict[str, Any],
                 none: str) -> Lever:
    if not moved:
        return Lever(name, "", skipped=none)
    changed = [{**stage, "index": {**{k: v for k, v in stage["index"].items() if k != "threads"}, **change}}
               if stage["name"] in moved else stage for stage in stages]
    return Lever(f"{name}: {', '.join(moved)}", "", {"application.stages": changed})


_MAKERS: tuple[tuple[str, Callable[[Scenario, dict[str, Any], Path], list[Lever]]], ...] = (
    ("wider", _wider), ("closer", _closer), ("more continuous", _continuous), ("compute", _compute),
    (APPLICATION_GROUP, _value_parallel))

