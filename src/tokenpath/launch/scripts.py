"""The launch of a deployment as a shell script per engine (and the YAML files TensorRT-LLM reads): the
processes of each pool, each on its own GPUs and port, and a header listing the scenario's settings no
flag carries. vLLM's one pool over several hosts, and SGLang's one replica, is one script that every host
runs with its NODE_RANK; the other launches are written for one host, and say so where the deployment
needs more."""

from __future__ import annotations

import json
from typing import Any

from tokenpath.launch import sglang, trtllm, vllm
from tokenpath.launch.command import Command, Settings
from tokenpath.launch.flags import programs
from tokenpath.launch.hosts import HEAD_ADDR_VARIABLE, NODE_RANK_VARIABLE, Hosts
from tokenpath.launch.plan import Plan, Role, common_notes, one_host_note

# Where the processes listen on the machine: the front door, and the servers behind a router.
HOST = "127.0.0.1"
FRONT_HOST = "0.0.0.0"
FRONT_PORT = 8000
FIRST_SERVER_PORT = 8100          # pools' servers count up from here when something fronts them
SGLANG_BOOTSTRAP_PORT = 8998      # SGLang's default --disaggregation-bootstrap-port, one per prefill server
# VLLM_NIXL_SIDE_CHANNEL_PORT of the first vLLM pool, as vLLM's guide. Each data-parallel engine of a pool
# listens on that port plus its rank (vLLM 0.34.0, distributed/kv_transfer/kv_connector/v1/nixl/
# base_scheduler.py:77), so each pool's port starts past the ranks of the pools before it.
NIXL_SIDE_CHANNEL_PORT = 5600


def gpus(plan: Plan, role: Role, first_replica: int, replicas: int) -> str:
    """CUDA_VISIBLE_DEVICES for `replicas` replicas of `role`, from its `first_replica`."""
    n = plan.gpus_per_replica
    start = role.first_gpu + first_replica * n
    return ",".join(str(g) for g in range(start, start + replicas * n))


def vllm_files(plan: Plan, settings: Settings) -> dict[str, str]:
    if vllm.server_per_replica(plan):
        return _vllm_servers(plan, settings)
    if not plan.disaggregated:
        role = plan.roles[0]
        comment = f"{role.replicas} replica(s) as vLLM's data-parallel engines"
        layout = plan.hosts(role)
        if not layout.one:
            head = vllm.command(plan, role, role.replicas, settings, layout=layout)
            other = vllm.command(plan, role, role.replicas, settings, layout=layout, head=False)
            return {"launch-vllm.sh": _hosts_script(plan, vllm.NAME, settings, layout, comment, head, other)}
        return {"launch-vllm.sh": _script(plan, vllm.NAME, settings, [
            (comment, vllm.command(plan, role, role.replicas, settings))])}
    one_host_note(plan, vllm.NAME, settings)
    blocks = []
    side_channel_port = NIXL_SIDE_CHANNEL_PORT
    for k, role in enumerate(plan.roles):
        cmd = vllm.command(plan, role, role.replicas, settings, port=FIRST_SERVER_PORT + k)
        cmd.env = {"CUDA_VISIBLE_DEVICES": gpus(plan, role, 0, role.replicas),
                   "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port)}
        side_channel_port += role.replicas
        blocks.append((f"the {role.name} pool: {role.replicas} replica(s)", cmd))
    return {"launch-vllm.sh": _script(plan, vllm.NAME, settings, blocks, background=True)}


def _vllm_servers(plan: Plan, settings: Settings) -> dict[str, str]:
    """A `vllm serve` per replica (vllm.server_per_replica), each on its own GPUs and port."""
    one_host_note(plan, vllm.NAME, settings)
    role = plan.roles[0]
    blocks = []
    for i in range(role.replicas):
        cmd = vllm.command(plan, role, 1, settings, host=HOST, port=FIRST_SERVER_PORT + i)
        cmd.env = {"CUDA_VISIBLE_DEVICES": gpus(plan, role, i, 1)}
        blocks.append((f"replica {i + 1} of {role.replicas}: a server of its own (an MoE model's data-parallel "
                       "engines in one server would step together)", cmd))
    settings.map("deployment.chips", "(one vllm serve per replica)")
    return {"launch-vllm.sh": _script(plan, vllm.NAME, settings, blocks, background=True)}


def sglang_files(plan: Plan, settings: Settings) -> dict[str, str]:
    if not plan.disaggregated and plan.roles[0].replicas > 1 and sglang.server_per_replica(plan):
        return _sglang_servers_behind_router(plan, settings)
    if not plan.disaggregated:
        role = plan.roles[0]
        comment = f"{role.replicas} replica(s) as SGLang's --dp-size"
        layout = plan.hosts(role)
        if not layout.one and role.replicas == 1 and sglang.over_hosts(plan, layout):
            cmd = sglang.command(plan, role, 1, settings, host=FRONT_HOST, port=FRONT_PORT, layout=layout)
            return {"launch-sglang.sh": _hosts_script(plan, sglang.NAME, settings, layout, comment, cmd)}
        one_host_note(plan, sglang.NAME, settings)
        return {"launch-sglang.sh": _script(plan, sglang.NAME, settings, [
            (comment, sglang.command(plan, role, role.replicas, settings, host=FRONT_HOST, port=FRONT_PORT))])}
    one_host_note(plan, sglang.NAME, settings)
    blocks, prefill, decode = [], [], []
    port, bootstrap = FIRST_SERVER_PORT, SGLANG_BOOTSTRAP_PORT
    for role in plan.roles:
        for first, replicas, comment in _sglang_servers(plan, role):
            bootstrap_port = bootstrap if role.name == "prefill" else None
            cmd = sglang.command(plan, role, replicas, settings, host=HOST, port=port, bootstrap_port=bootstrap_port)
            cmd.env = {"CUDA_VISIBLE_DEVICES": gpus(plan, role, first, replicas)}
            blocks.append((comment, cmd))
            url = f"http://{HOST}:{port}"
            if bootstrap_port is not None:
                prefill.append((url, bootstrap_port))
                bootstrap += 1  # each prefill server's own, on the one host
            else:
                decode.append(url)
            port += 1
    blocks.append(("the router: each request to a prefill server, then a decode server",
                   sglang.router(plan, prefill, decode, settings, FRONT_HOST, FRONT_PORT)))
    return {"launch-sglang.sh": _script(plan, sglang.NAME, settings, blocks, background=True)}


def _sglang_servers(plan: Plan, role: Role) -> list[tuple[int, int, str]]:
    """A pool's SGLang servers as (first replica, replicas, comment): one for the pool, its replicas as
    --dp-size, or one per replica where a server holds only one (sglang.server_per_replica)."""
    if not sglang.server_per_replica(plan) or role.replicas == 1:
        return [(0, role.replicas, f"the {role.name} pool: {role.replicas} replica(s)")]
    return [(r, 1, f"the {role.name} pool, replica {r + 1} of {role.replicas}: a server of its own "
                   "(attention data-parallel)") for r in range(role.replicas)]


def _sglang_servers_behind_router(plan: Plan, settings: Settings) -> dict[str, str]:
    """One server per replica (sglang.server_per_replica), sglang_router in front of them."""
    one_host_note(plan, sglang.NAME, settings)
    role = plan.roles[0]
    blocks, urls = [], []
    for k, (first, replicas, comment) in enumerate(_sglang_servers(plan, role)):
        port = FIRST_SERVER_PORT + k
        cmd = sglang.command(plan, role, replicas, settings, host=HOST, port=port)
        cmd.env = {"CUDA_VISIBLE_DEVICES": gpus(plan, role, first, replicas)}
        blocks.append((comment, cmd))
        urls.append(f"http://{HOST}:{port}")
    blocks.append(("the router: requests over the replicas' servers",
                   sglang.worker_router(plan, urls, settings, FRONT_HOST, FRONT_PORT)))
    return {"launch-sglang.sh": _script(plan, sglang.NAME, settings, blocks, background=True)}


def trtllm_files(plan: Plan, settings: Settings) -> dict[str, str]:
    one_host_note(plan, trtllm.NAME, settings)
    files: dict[str, str] = {}
    blocks: list[tuple[str, Command]] = []
    urls: dict[str, list[str]] = {}
    alone = not plan.disaggregated and plan.roles[0].replicas == 1
    port = FRONT_PORT if alone else FIRST_SERVER_PORT
    for role in plan.roles:
        name = f"extra-llm-api-{role.name}.yaml"
        files[name] = yaml_text(trtllm.extra_options(plan, role, settings))
        for i in range(role.replicas):
            cmd = trtllm.command(plan, settings, name, host=FRONT_HOST if alone else HOST, port=port)
            if not alone:
                cmd.env = {"CUDA_VISIBLE_DEVICES": gpus(plan, role, i, 1)}
            blocks.append((f"{role.name} replica {i + 1} of {role.replicas}", cmd))
            urls.setdefault(role.name, []).append(f"{HOST}:{port}")
            port += 1
    settings.map("deployment.chips", "(one trtllm-serve per replica)")
    if plan.disaggregated:
        files["disagg.yaml"] = yaml_text(trtllm.disaggregated_config(FRONT_HOST, FRONT_PORT, urls["prefill"],
                                                                     urls["decode"]))
        cmd = Command(list(trtllm.DISAGGREGATED))
        cmd.add(settings, "deployment.prefill_replicas", "-c", "disagg.yaml")
        blocks.append(("the disaggregated server: each request to a context server, then a generation server", cmd))
    files["launch-trtllm.sh"] = _script(plan, trtllm.NAME, settings, blocks, background=len(blocks) > 1)
    return files


def yaml_text(document: Any) -> str:
    """A YAML document as JSON, which YAML 1.2 reads as it is (no YAML writer is a dependency)."""
    return json.dumps(document, indent=2) + "\n"


def header(plan: Plan, program: str, settings: Settings) -> list[str]:
    """The comment lines that open a launch file: what it launches, with which engine version, and every
    scenario setting no flag carries."""
    p = programs()[program]
    s = plan.scenario
    lines = [f"Scenario {s.name!r}: {s.model.name} {s.model.precision} on {s.deployment.chips} x {s.deployment.chip}, "
             f"tp={s.deployment.tp} pp={s.deployment.pp}, " + ", ".join(f"{r.name}: {r.replicas} replica(s)"
                                                                          for r in plan.roles),
             f"Model: {plan.checkpoint.hf_id}",
             f"Flags of {program} {p['version']} (tokenpath launch/flags.toml records where each is defined)."]
    if settings.notes:
        lines.append("Not carried by a flag, or not as the scenario has it:")
        lines += [f"  {note.setting}: {note.text}" for note in settings.notes]
    return lines


def _script(plan: Plan, program: str, settings: Settings, blocks: list[tuple[str, Command]],
            background: bool = False) -> str:
    common_notes(plan, program, settings)
    out = ["#!/bin/sh", *(f"# {line}" for line in header(plan, program, settings)), ""]
    for comment, cmd in blocks:
        out += [f"# {comment}", cmd.shell() + (" &" if background else ""), ""]
    if background:
        out.append("wait")
    return "\n".join(out).rstrip("\n") + "\n"


def _hosts_script(plan: Plan, program: str, settings: Settings, layout: Hosts, comment: str, head: Command,
                  other: Command | None = None) -> str:
    """One script for every host of a pool: its one command, or host 0's and the others' (`other`)."""
    common_notes(plan, program, settings)
    last = layout.count - 1
    use = "all" if layout.gpus_per_host == layout.chips_per_host else f"{layout.gpus_per_host} of the"
    others = "1 on the other" if last == 1 else f"1 to {last} on the others"
    rank, addr = NODE_RANK_VARIABLE, HEAD_ADDR_VARIABLE
    out = ["#!/bin/sh", *(f"# {line}" for line in header(plan, program, settings)), "",
           f"# {layout.count} hosts, each running {use} {layout.chips_per_host} GPUs: run this script on every one, "
           f"with {rank} its index",
           f"# (0 on the host that serves the API, {others}) and {addr} the address of host 0.",
           f': "${{{rank}:?set {rank} to this host\'s index, 0 to {last}}}"',
           f': "${{{addr}:?set {addr} to the address of host 0}}"', "",
           f"# {comment}"]
    out += [head.shell()] if other is None else [f'if [ "${rank}" = 0 ]; then', head.shell(), "else",
                                                 other.shell(), "fi"]
    return "\n".join(out) + "\n"
