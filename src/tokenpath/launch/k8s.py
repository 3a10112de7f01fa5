"""The deployment as Kubernetes objects: per pool a Deployment of one pod per replica, each pod holding
tp x pp GPUs and running the engine the scenario's profile models (vLLM by default), and a Service in
front of its pods; TensorRT-LLM's YAML in a ConfigMap."""

from __future__ import annotations

import re
from typing import Any

from tokenpath.launch import sglang, trtllm, vllm
from tokenpath.launch.command import Command, Settings
from tokenpath.launch.flags import programs
from tokenpath.launch.plan import Plan, Role, common_notes
from tokenpath.launch.scripts import FRONT_HOST, FRONT_PORT, SGLANG_BOOTSTRAP_PORT, header, yaml_text

GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource name
CONFIG_DIR = "/etc/tokenpath"    # where a pod finds its ConfigMap's files
HEALTH_PATH = "/health"          # vLLM's, SGLang's and trtllm-serve's health endpoint
MAX_NAME_CHARS = 40              # a DNS label is at most 63 characters; the role and kind are appended


def manifest(plan: Plan, settings: Settings) -> tuple[str, str]:
    """(the engine the pods run, the manifest's text: its objects as YAML documents)."""
    engine = plan.profile.launched_with
    base = _name(plan.scenario.name)
    documents: list[dict[str, Any]] = []
    for role in plan.roles:
        name = f"{base}-{role.name}"
        cmd, config = _container_command(plan, engine, role, settings)
        if config is not None:
            documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                              "data": {f"extra-llm-api-{role.name}.yaml": yaml_text(config)}})
        documents.append(_deployment(plan, engine, name, role, cmd, config is not None))
        documents.append(_service(name, role))
    settings.map("deployment.chips", "Deployment replicas")
    if plan.gpus_per_replica > plan.chips_per_host:
        settings.note("deployment.chips", f"each pod asks for {plan.gpus_per_replica} GPUs, more than a node of "
                                          f"{plan.chips_per_host} has: a replica over several nodes needs a "
                                          "multi-node workload (a LeaderWorkerSet), which this manifest is not")
    if plan.scenario.deployment.replicas > 1:
        settings.note("deployment.routing", "a Service spreads connections over its pods (kube-proxy); no field "
                                            f"gives {plan.scenario.deployment.routing}")
    common_notes(plan, engine, settings)
    if plan.disaggregated:
        settings.note("deployment.prefill_replicas", "the pools' Services front their pods; requests need the "
                                                     "engine's prefill-then-decode router in front of them, not "
                                                     "emitted here (see --engine " + engine + ")")
    lines = [f"# {line}" for line in header(plan, engine, settings)]
    lines.append(f"# Kubernetes objects: each pod one replica on {plan.gpus_per_replica} GPU(s), running {engine}.")
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


def _deployment(plan: Plan, engine: str, name: str, role: Role, cmd: Command, configured: bool) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": role.name,
              "app.kubernetes.io/part-of": _name(plan.scenario.name)}
    mounts = [{"name": "shm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    if configured:
        mounts.append({"name": "config", "mountPath": CONFIG_DIR})
        volumes.append({"name": "config", "configMap": {"name": name}})
    container = {
        "name": engine,
        "image": programs()[engine]["image"],
        "command": cmd.argv,
        "ports": [{"containerPort": FRONT_PORT, "name": "http"}],
        "resources": {"limits": {GPU_RESOURCE: plan.gpus_per_replica}},
        "readinessProbe": {"httpGet": {"path": HEALTH_PATH, "port": FRONT_PORT}},
        "volumeMounts": mounts,
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": role.replicas, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [container], "volumes": volumes}}}}


def _service(name: str, role: Role) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app.kubernetes.io/name": name},
                     "ports": [{"name": "http", "port": FRONT_PORT, "targetPort": FRONT_PORT}]}}


def _name(scenario_name: str) -> str:
    """A DNS-1123 label from the scenario's name."""
    label = re.sub(r"[^a-z0-9-]+", "-", scenario_name.lower()).strip("-")[:MAX_NAME_CHARS].strip("-")
    return label or "tokenpath"
