"""How a deployment's front end is laid out over its engines: the engine profile's processes
(engine/profiles.py), or the counts the scenario sets, shared out to each engine the simulation runs.

A deployment runs `deployment.api_servers` API-server processes in all (unset: the profile's, one per
data-parallel replica or one for the whole server), and an engine that detokenizes in a process of its
own runs one for the server. Engines run apart in the simulation, so each gets its share, total/engines
of the processes: ceil(total/engines) processes, each shared so as to leave the total exact. A share
never exceeds one process: each API server is one Python process (vLLM's run_multi_api_server in
vllm/entrypoints/cli/serve.py starts each apart), so one request's work runs on one CPU at most, and 6
processes for 4 engines are 2 processes at 0.75 each, not one at 1.5. With fewer processes than engines,
a share of one process. How a shared process runs one engine's work: delivery/frontend.py.
"""

from __future__ import annotations

from tokenpath.delivery.frontend import Layout, Placement
from tokenpath.engine.profiles import PROFILES
from tokenpath.sim.scenario import Scenario


def api_servers(scenario: Scenario) -> int:
    """The deployment's API-server processes: the scenario's count, or the profile's default."""
    dep = scenario.deployment
    if dep.api_servers is not None:
        return dep.api_servers
    return dep.replicas if scenario.engine.api_servers_per_replica else 1


def detokenizes_in(scenario: Scenario) -> Placement:
    """The process that detokenizes: the scenario's `delivery.detokenize`, or the profile's."""
    return scenario.delivery.detokenize or PROFILES[scenario.engine.scheduler].detokenizes_in


def layout(scenario: Scenario, engines: int) -> Layout:
    """One engine's share of the front end, when `engines` engines (replicas x pipeline batches in
    flight) share the deployment's processes."""
    total = api_servers(scenario)
    processes = -(-total // engines)  # rounded up, so that each process's share is at most one CPU
    profile = PROFILES[scenario.engine.scheduler]
    # A calibration of `tokenpath serve` prices serve's own process, which tokenizes a prompt on its loop
    # (serve/app.py: beyond INLINE_PARSE_BYTES in a thread, which a benchmark's prompts are not) and writes
    # every event it is due, where the engine's process runs its own way
    engine_process = not (scenario.delivery.calibration and scenario.delivery.calibrated_server == "serve")
    return Layout(detokenizes_in(scenario), processes, total / (engines * processes), 1 / engines,
                  profile.outputs_per_event,
                  engine_process and profile.tokenizes_in_thread(scenario.engine.version),
                  engine_process and profile.merges_events)
