"""A scenario's deployment resolved for launching: the checkpoint, the roles (one pool of replicas, or a
prefill and a decode pool) with their GPUs and API servers, the engine settings the profile fills in,
and the settings no engine has a flag for."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath.config.errors import UserError
from tokenpath.engine.profiles import PROFILES, Profile
from tokenpath.launch.command import Command, Settings
from tokenpath.launch.hosts import Hosts, hosts
from tokenpath.launch.model_id import Checkpoint, checkpoint
from tokenpath.sim import front_end
from tokenpath.sim.scenario import Scenario

# Every scenario setting that describes the server. Each emitter maps each one to flags or notes why
# it cannot (tests/test_launch.py checks); the workload, SLO and client side are not the server's.
SETTINGS = (
    "model.name", "model.precision", "model.expert_precision", "model.kv_cache_precision",
    "deployment.chip", "deployment.chips", "deployment.tp", "deployment.pp", "deployment.expert_parallel",
    "deployment.attention_dp", "deployment.moe_all_to_all",
    "deployment.prefill_replicas", "deployment.routing", "deployment.api_servers", "deployment.fabric",
    "deployment.placement",
    "engine.max_num_seqs", "engine.max_num_batched_tokens", "engine.block_size", "engine.chunked_prefill",
    "engine.gpu_memory_utilization", "engine.cuda_graphs", "engine.cuda_graph_max_tokens", "engine.cuda_graph_padding",
    "engine.prefill_cuda_graphs",
    "engine.scheduler",
    "engine.mixed_chunk", "engine.kv_admission", "engine.host_overlap", "engine.prefix_caching",
    "engine.num_scheduler_steps", "engine.speculative", "engine.eager_host", "engine.nccl_nvls",
    "delivery.stream_interval", "delivery.detokenize",
)


@dataclass(frozen=True)
class Role:
    """A pool of identical replicas: "server" (every replica prefills and decodes), "prefill" or "decode"."""

    name: str
    replicas: int
    api_servers: int  # the pool's API-server processes, all replicas together
    first_gpu: int    # its first GPU when the pools share one machine


@dataclass(frozen=True)
class Plan:
    scenario: Scenario
    checkpoint: Checkpoint
    roles: tuple[Role, ...]
    profile: Profile      # the scheduler the scenario was simulated with
    kv_precision: str     # "bf16" or "fp8", the profile's rule applied
    host_overlap: bool
    detokenizes_in: str
    # The draft model's checkpoint for speculative method draft_model; None for another drafter, or a
    # draft without a Hugging Face id (a config.json)
    draft: Checkpoint | None = None
    # The largest prompt step simulated replaying a graph apart from decode graphs (SGLang's, engine/cuda_graphs.py;
    # None: none)
    prefill_graph_tokens: int | None = None
    chips_per_host: int = 8  # the GPUs one machine holds (the chip's, compute/chip.py)
    fabric: str = ""  # the fabric simulated, in words (Deployment.fabric_name)
    vendor: str = "nvidia"  # who makes the chip (compute/chip.py): the engines and images that run on it
    moe: bool = False  # the model has routed experts
    # The longest request one replica's KV cache holds, where that is less than the model's context (None:
    # it holds the whole context): an engine that checks at start that its cache holds one request of its
    # context is told this one
    context_tokens: int | None = None

    @property
    def gpus_per_replica(self) -> int:
        return self.scenario.deployment.tp * self.scenario.deployment.pp

    @property
    def disaggregated(self) -> bool:
        return len(self.roles) > 1

    def hosts(self, role: Role) -> Hosts:
        """The hosts a pool's replicas take (launch/hosts.py)."""
        return hosts(role.replicas, self.gpus_per_replica, self.chips_per_host)

    def weights(self) -> str:
        """How the checkpoint's weights meet the scenario's precision: "as-stored" (the same precision),
        "given" (the user's checkpoint, taken as the scenario's), "quantize" (bf16 weights quantized
        to fp8 as the engine loads them) or "mismatch" (no engine flag turns one into the other)."""
        model, checkpoint = self.scenario.model, self.checkpoint
        if checkpoint.precision is None:
            return "given"
        stored = (checkpoint.precision, checkpoint.expert_precision or checkpoint.precision)
        wanted = (model.precision, model.expert_precision or model.precision)
        if stored == wanted:
            return "as-stored"
        return "quantize" if (stored, wanted) == (("bf16", "bf16"), ("fp8", "fp8")) else "mismatch"


def make_plan(scenario: Scenario, model_id: str | None = None) -> Plan:
    """The launch plan of `scenario`, after the checks `simulate` makes of its deployment."""
    from tokenpath.sim.deployment import build_deployment

    deployment = build_deployment(scenario)  # the same refusals as a simulation: shapes, splits, disaggregation limits
    dep = scenario.deployment
    profile = PROFILES[scenario.engine.scheduler]
    total = front_end.api_servers(scenario)
    if dep.prefill_replicas:
        decode = dep.replicas - dep.prefill_replicas
        roles = (Role("prefill", dep.prefill_replicas, _share(total, dep.prefill_replicas, dep.replicas), 0),
                 Role("decode", decode, _share(total, decode, dep.replicas), dep.prefill_replicas * dep.tp * dep.pp))
    else:
        roles = (Role("server", dep.replicas, total, 0),)
    host_overlap = scenario.engine.host_overlap
    held = scenario.engine.longest_request_tokens(deployment.kv_capacity_tokens)
    return Plan(scenario, checkpoint(scenario, model_id), roles, profile,
                scenario.kv_precision(),
                profile.host_overlap if host_overlap is None else host_overlap,
                front_end.detokenizes_in(scenario), _draft_checkpoint(scenario),
                deployment.compute.prefill_graph_max_tokens, deployment.chip.chips_per_host, deployment.fabric_name,
                deployment.chip.vendor, deployment.model.is_moe,
                held if held < deployment.model.max_context else None)


def _draft_checkpoint(scenario: Scenario) -> Checkpoint | None:
    """The checkpoint of a `draft_model` drafter, found as the served model's is (a catalog model's
    `hf_id`, or the Hugging Face id it is named by); None for another drafter or a draft without an id."""
    speculative = scenario.engine.speculative
    if speculative is None or speculative.draft_model is None:
        return None
    draft = scenario.model_copy(update={"model": scenario.model.model_copy(update={"name": speculative.draft_model})})
    try:
        return checkpoint(draft)
    except UserError:  # a config.json, or a catalog model without an hf_id
        return None


def _share(total: int, replicas: int, of: int) -> int:
    """A pool's API servers: its share of the deployment's, at least one."""
    return max(1, total * replicas // of)


def nccl_nvls_default(plan: Plan, settings: Settings) -> None:
    """engine.nccl_nvls for an engine whose NCCL keeps its default, NVLS where the switches have it (vLLM's,
    TensorRT-LLM's): no flag turns it off."""
    if plan.scenario.engine.nccl_nvls:
        settings.map("engine.nccl_nvls", "(NCCL's default: NVLS where the switches have it)")
    else:
        settings.note("engine.nccl_nvls", "no flag turns NVLS off: set NCCL_NVLS_ENABLE=0 in the server's environment")


def weight_flags(plan: Plan, cmd: Command, settings: Settings, engine: str, quantize_to_fp8: str) -> None:
    """The weights' precision as vLLM and SGLang take it: `--quantization quantize_to_fp8` where the
    engine quantizes a bf16 checkpoint as it loads it, `--dtype bfloat16` for bf16 weights, else the
    checkpoint's own, or a note when no flag serves the precision simulated."""
    wanted = plan.scenario.model.precision
    how = plan.weights()
    if how == "quantize":
        cmd.add(settings, "model.precision", "--quantization", quantize_to_fp8)
    elif how == "as-stored" and wanted == "bf16":
        cmd.add(settings, "model.precision", "--dtype", "bfloat16")
    elif how == "as-stored":
        settings.map("model.precision", "(the checkpoint's own quantization)")
    elif how == "given":
        settings.note("model.precision", f"served as the --model-id checkpoint stores it: use one stored in {wanted}")
    else:
        settings.note("model.precision", f"{plan.checkpoint.hf_id} is stored in {plan.checkpoint.stored()} and "
                                          f"{engine} has no flag to serve it in {wanted}: pass --model-id with a "
                                          f"{wanted} checkpoint")
    expert_precision_setting(plan, settings)


def expert_precision_setting(plan: Plan, settings: Settings) -> None:
    """The routed experts' precision: carried with the weights' (the checkpoint's own, or the scenario's
    precision), or noted where the scenario's differs from the checkpoint's and no flag changes it."""
    experts = plan.scenario.model.expert_precision
    if experts is None or experts == plan.scenario.model.precision:
        settings.map("model.expert_precision", "(as model.precision)")
    elif plan.weights() in ("as-stored", "given"):
        settings.map("model.expert_precision", "(the checkpoint's own)")
    else:
        settings.note("model.expert_precision", f"no flag quantizes the routed experts apart from the other weights: "
                                                f"pass --model-id with a checkpoint of {experts} experts")


def common_notes(plan: Plan, engine: str, settings: Settings) -> None:
    """The settings no engine's flag carries, and the engine launched against the one simulated."""
    dep = plan.scenario.deployment
    settings.note("deployment.chip", f"no flag: the engine runs on the GPUs it is given; the scenario models "
                                     f"{dep.chip}")
    settings.note("deployment.fabric", f"no flag: how the GPUs are linked is the machine's (the scenario models "
                                       f"{plan.fabric})")
    settings.note("deployment.placement", f"no flag: which GPU holds which rank is the launcher's (the scenario "
                                          f"places them {_placement(dep.placement)})")
    if plan.profile.launched_with == engine:
        settings.map("engine.scheduler", engine)
    else:
        settings.note("engine.scheduler", f"the scenario was simulated with {plan.profile.engine}'s scheduler "
                                          f"(scheduler = {plan.scenario.engine.scheduler}); {engine} schedules as "
                                          "it does, so simulate with its profile to predict this launch")
    if plan.disaggregated:
        total = front_end.api_servers(plan.scenario)
        if sum(role.api_servers for role in plan.roles) != total:
            settings.note("deployment.api_servers", f"the deployment's {total} API server(s) split over the pools "
                                                    "as " + ", ".join(f"{r.api_servers} for {r.name}"
                                                                      for r in plan.roles))


def one_host_note(plan: Plan, engine: str, settings: Settings) -> None:
    """For an emitter that writes its launch for one host: a note where a pool needs more (launch/hosts.py)."""
    for role in plan.roles:
        layout = plan.hosts(role)
        if not layout.one:
            settings.note("deployment.chips", f"the {role.name} pool's {role.replicas * plan.gpus_per_replica} GPUs "
                                              f"take {layout.count} hosts of {plan.chips_per_host} "
                                              f"({layout.gpus_per_host} on each); this file starts them on one, as "
                                              f"tokenpath writes this {engine} launch for one host only")


def _placement(placement: object) -> str:
    return placement if isinstance(placement, str) else "on the hosts listed"
