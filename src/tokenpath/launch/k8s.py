"""The deployment as Kubernetes objects: per pool a Deployment of one pod per replica, each pod holding
tp x pp GPUs and running the engine the scenario's profile models (vLLM by default), and a Service in
front of its pods; TensorRT-LLM's YAML in a ConfigMap. A replica larger than a node is a group of pods,
one a node, as a LeaderWorkerSet (kubernetes-sigs/lws, api/leaderworkerset/v1/leaderworkerset_types.go):
its leader serves, and every pod finds its rank and the leader in the variables the LeaderWorkerSet sets
in its containers, which Kubernetes expands in the command."""

from __future__ import annotations

import re
from typing import Any

from tokenpath.config.errors import UserError
from tokenpath.launch import sglang, trtllm, vllm
from tokenpath.launch.command import Command, Settings
from tokenpath.launch.flags import programs
from tokenpath.launch.hosts import Hosts, hosts
from tokenpath.launch.plan import Plan, Role, common_notes
from tokenpath.launch.scripts import FRONT_HOST, FRONT_PORT, SGLANG_BOOTSTRAP_PORT, header, yaml_text

# The resource a pod asks its GPUs of, by the chip's vendor (compute/chip.py): the NVIDIA device plugin's,
# and AMD's (ROCm/k8s-device-plugin, cmd/k8s-device-plugin/main.go: namespace "amd.com", resource "gpu").
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
CONFIG_DIR = "/etc/tokenpath"    # where a pod finds its ConfigMap's files
HEALTH_PATH = "/health"          # vLLM's, SGLang's and trtllm-serve's health endpoint
MAX_NAME_CHARS = 40              # a DNS label is at most 63 characters; the role and kind are appended
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"            # SetNameLabelKey
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"   # WorkerIndexLabelKey: "0" on the leader
# LwsWorkerIndex and LwsLeaderAddress, as Kubernetes expands an environment variable in a command
LWS_RANK, LWS_LEADER = "$(LWS_WORKER_INDEX)", "$(LWS_LEADER_ADDRESS)"


def manifest(plan: Plan, settings: Settings) -> tuple[str, str]:
    """(the engine the pods run, the manifest's text: its objects as YAML documents)."""
    engine = plan.profile.launched_with
    base = _name(plan.scenario.name)
    documents: list[dict[str, Any]] = []
    group = hosts(1, plan.gpus_per_replica, plan.chips_per_host)  # one replica's nodes
    grouped = not group.one and (engine == vllm.NAME or engine == sglang.NAME and sglang.over_hosts(plan, group))
    for role in plan.roles:
        name = f"{base}-{role.name}"
        if grouped:
            documents.append(_leader_worker_set(plan, engine, name, role, group, settings))
            documents.append(_service(name, role, {LWS_NAME_LABEL: name, LWS_INDEX_LABEL: "0"}))
            continue
        cmd, config = _container_command(plan, engine, role, settings)
        if config is not None:
            documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                              "data": {f"extra-llm-api-{role.name}.yaml": yaml_text(config)}})
        documents.append(_deployment(plan, engine, name, role, cmd, config is not None))
        documents.append(_service(name, role, {"app.kubernetes.io/name": name}))
    settings.map("deployment.chips", "LeaderWorkerSet replicas and size" if grouped else "Deployment replicas")
    if not group.one and not grouped:
        settings.note("deployment.chips", f"each pod asks for {plan.gpus_per_replica} GPUs, more than a node of "
                                          f"{plan.chips_per_host} has: a replica over several nodes needs a "
                                          f"multi-node workload (a LeaderWorkerSet), which this manifest does not "
                                          f"write for {engine} here")
    if plan.scenario.deployment.replicas > 1:
        settings.note("deployment.routing", "a Service spreads connections over its pods (kube-proxy); no field "
                                            f"gives {plan.scenario.deployment.routing}")
    common_notes(plan, engine, settings)
    if plan.disaggregated:
        settings.note("deployment.prefill_replicas", "the pools' Services front their pods; requests need the "
                                                     "engine's prefill-then-decode router in front of them, not "
                                                     "emitted here (see --engine " + engine + ")")
    lines = [f"# {line}" for line in header(plan, engine, settings)]
    lines.append(f"# Kubernetes objects: each replica a group of {group.count} pods on {group.gpus_per_host} GPU(s) "
                 f"each (a LeaderWorkerSet), running {engine}." if grouped else
                 f"# Kubernetes objects: each pod one replica on {plan.gpus_per_replica} GPU(s), running {engine}.")
    text = "\n".join(lines) + "\n" + "---\n".join(yaml_text(d) for d in documents)
    return engine, text


def _container_command(plan: Plan, engine: str, role: Role, settings: Settings) -> tuple[Command, dict | None]:
    if engine == vllm.NAME:
        return vllm.command(plan, role, 1, settings, host=FRONT_HOST, port=FRONT_PORT), None
    if engine == sglang.NAME:
        bootstrap = SGLANG_BOOTSTRAP_PORT if role.name == "prefill" else None
        return sglang.command(plan, role, 1, settings, host=FRONT_HOST, port=FRONT_PORT,
                              bootstrap_port=bootstrap), None
    config = trtllm.extra_options(plan, role, settings)
    settings.map("deployment.chips", "Deployment replicas")
    return trtllm.command(plan, settings, f"{CONFIG_DIR}/extra-llm-api-{role.name}.yaml", host=FRONT_HOST,
                          port=FRONT_PORT), config


def _labels(plan: Plan, name: str, role: Role) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": role.name,
            "app.kubernetes.io/part-of": _name(plan.scenario.name)}


def _pod_template(plan: Plan, engine: str, name: str, role: Role, cmd: Command, gpus: int, serves: bool = True,
                  configured: bool = False) -> dict[str, Any]:
    """A pod of `gpus` GPUs running `cmd`; `serves`: it listens for requests (a group's workers do not)."""
    mounts = [{"name": "shm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    if configured:
        mounts.append({"name": "config", "mountPath": CONFIG_DIR})
        volumes.append({"name": "config", "configMap": {"name": name}})
    container: dict[str, Any] = {"name": engine, "image": _image(plan, engine), "command": cmd.argv}
    if serves:
        container["ports"] = [{"containerPort": FRONT_PORT, "name": "http"}]
    container["resources"] = {"limits": {GPU_RESOURCES[plan.vendor]: gpus}}
    if serves:
        container["readinessProbe"] = {"httpGet": {"path": HEALTH_PATH, "port": FRONT_PORT}}
    container["volumeMounts"] = mounts
    return {"metadata": {"labels": _labels(plan, name, role)}, "spec": {"containers": [container], "volumes": volumes}}


def _image(plan: Plan, engine: str) -> str:
    """The engine's image for the chip's vendor: its CUDA one, or on AMD GPUs its ROCm one (flags.toml's
    rocm_image), else a UserError saying none is known."""
    program = programs()[engine]
    if plan.vendor != "amd":
        return program["image"]
    if "rocm_image" not in program:
        raise UserError(f"deployment.chip: {plan.scenario.deployment.chip} is an AMD GPU, and tokenpath knows no ROCm "
                        f"image of {engine} {program['version']} (launch/flags.toml): launch it with --engine {engine} "
                        "on hosts with its ROCm build, or simulate with engine.scheduler = vllm-v1 to run vLLM's")
    return program["rocm_image"]


def _deployment(plan: Plan, engine: str, name: str, role: Role, cmd: Command, configured: bool) -> dict[str, Any]:
    metadata = {"name": name, "labels": _labels(plan, name, role)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
            "spec": {"replicas": role.replicas, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                     "template": _pod_template(plan, engine, name, role, cmd, plan.gpus_per_replica,
                                               configured=configured)}}


def _leader_worker_set(plan: Plan, engine: str, name: str, role: Role, group: Hosts,
                       settings: Settings) -> dict[str, Any]:
    """A replica per group of `group.count` pods, one a node: the leader rank 0 and serving, the workers
    the other ranks; a pod that restarts restarts its group (RecreateGroupOnPodRestart), since a replica
    with a rank missing cannot run."""
    if engine == vllm.NAME:
        leader = vllm.command(plan, role, 1, settings, host=FRONT_HOST, port=FRONT_PORT, layout=group,
                              head_addr=LWS_LEADER)
        worker = vllm.command(plan, role, 1, settings, layout=group, head=False, rank=LWS_RANK, head_addr=LWS_LEADER)
    else:
        address = f"{LWS_LEADER}:{sglang.DIST_INIT_PORT}"
        leader = sglang.command(plan, role, 1, settings, host=FRONT_HOST, port=FRONT_PORT, layout=group,
                                rank=LWS_RANK, dist_init_addr=address)
        worker = sglang.command(plan, role, 1, settings, layout=group, rank=LWS_RANK, dist_init_addr=address)
    metadata = {"name": name, "labels": _labels(plan, name, role)}
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": metadata,
            "spec": {"replicas": role.replicas,
                     "leaderWorkerTemplate": {
                         "size": group.count, "restartPolicy": "RecreateGroupOnPodRestart",
                         "leaderTemplate": _pod_template(plan, engine, name, role, leader, group.gpus_per_host),
                         "workerTemplate": _pod_template(plan, engine, name, role, worker, group.gpus_per_host,
                                                         serves=False)}}}


def _service(name: str, role: Role, selector: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": selector,
                     "ports": [{"name": "http", "port": FRONT_PORT, "targetPort": FRONT_PORT}]}}


def _name(scenario_name: str) -> str:
    """A DNS-1123 label from the scenario's name."""
    label = re.sub(r"[^a-z0-9-]+", "-", scenario_name.lower()).strip("-")[:MAX_NAME_CHARS].strip("-")
    return label or "tokenpath"
