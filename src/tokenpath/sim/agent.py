"""Agent loops (application/loop.py) with the simulated deployment: a user request's model calls are the
turns of one session, so the engine's sessions machinery (engine/loop.py, and DP routing's session
affinity) sends each later call when the call before it has reached the client and the stages between
them have run, its prompt the call before's prompt and answer and the tools' result, which the prefix
cache finds; then each request's calls are gathered back into one row as the user sees it.

The user reads the last call's answer only (the calls before answer with tool calls), so TTFT and TTFV
run from the user's send to that call's first token and first visible character, and the token times,
TPOT, ITL and continuity are that call's. Queue, compute, traffic and delivery are summed over the
calls, `application` holds the stages before the first call, between the calls and after the last.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenpath.application.spec import ApplicationSpec
from tokenpath.application.stream import streamed_into
from tokenpath.application.timeline import Timeline, draw_latencies_ns, timeline
from tokenpath.config.errors import UserError
from tokenpath.sim.deployment import check_fits
from tokenpath.sim.run import Run, token_rows
from tokenpath.workload import Requests
from tokenpath.workload.generate import earlier_in_session, session_prefixes
from tokenpath.workload.lengths import sample_lengths
from tokenpath.workload.requests import Sessions
from tokenpath.workload.size import require_memory
from tokenpath.workload.spec import MAX_TURNS

if TYPE_CHECKING:
    from tokenpath.sim.deployment import Deployment
    from tokenpath.sim.scenario import Scenario


@dataclass(frozen=True)
class AgentPlan:
    """Per user request, in the order of its first call: the stages around the loop (`outer`: before the
    first call and after the last) and its number of calls; per call (the calls' rows) the time of the
    stages between it and the call before (0 for a first call), in all and by stage."""

    outer: Timeline
    calls: np.ndarray
    between_ns: np.ndarray
    between_detail_ns: dict[str, np.ndarray]

    @property
    def last(self) -> np.ndarray:
        """Each request's last call (its row)."""
        return np.cumsum(self.calls) - 1

    @property
    def first(self) -> np.ndarray:
        return self.last + 1 - self.calls

    @property
    def pre_ns(self) -> np.ndarray:
        """Per call, the stages before its request's first call: each call's scheduled time (its
        request's first call's) less this is the user's send, as a Timeline's pre_ns per request."""
        return np.repeat(self.outer.pre_ns, self.calls)


def around_loop(spec: ApplicationSpec) -> ApplicationSpec:
    """The application without the stages between the calls, the model stage without its loop: the
    stages before the first call and after the last."""
    between = set(spec.between())
    call = spec.model.model_copy(update={"loop": None})
    return ApplicationSpec(stages=[call if stage.kind == "model" else stage for stage in spec.stages
                                   if stage.name not in between])


def between_calls(spec: ApplicationSpec) -> ApplicationSpec:
    """The stages between two calls, each with no `after` of its own waiting for the model call: laid out
    by `timeline`, their time after the model is the wait between the calls."""
    model = spec.model
    between = spec.between()
    call = model.model_copy(update={"loop": None, "after": [], "prompt": None})
    stages = [stage.model_copy(update={"after": list(stage.after) or [model.name]})
              for stage in spec.stages if stage.name in between]
    return ApplicationSpec(stages=[call, *stages])


def agent_calls(spec: ApplicationSpec, firsts: Requests, outer: Timeline,
                rng: np.random.Generator) -> tuple[Requests, AgentPlan]:
    """Every model call of every user request, given each request's first call (`firsts`, in the order
    they reach the server) and its stages around the loop (`outer`): a request's calls are consecutive
    rows, a session's turns. Draws, in this order, each request's calls, then each call but the last's
    output, then each tools' result, then the between stages' times."""
    loop, where = spec.model.loop, f"application: stage {spec.model.name!r} loop"
    n = len(firsts)
    if isinstance(loop.turns, int):
        calls = np.full(n, loop.turns, np.int64)
    else:
        calls = np.minimum(sample_lengths(loop.turns, n, rng, f"{where}.turns"), MAX_TURNS)
    rows = int(calls.sum())
    heads = np.zeros(n, np.int64) if firsts.prefixes is None else np.diff(firsts.prefixes.offsets)
    # Each call names its head's segments and every message and answer so far.
    segments = int((calls * heads + calls * (calls + 1)).sum())
    require_memory(rows, int(firsts.output_tokens.sum()) + rows - n, segments, f"{where}.turns",
                   "each call names every call before it")
    user = np.repeat(np.arange(n), calls)
    turn = np.arange(rows) - np.repeat(np.cumsum(calls) - calls, calls)
    tool_call = np.ones(rows, bool)
    tool_call[np.cumsum(calls) - 1] = False
    answers = firsts.output_tokens[user]
    answers[tool_call] = sample_lengths(loop.call_output, rows - n, rng, f"{where}.call_output")
    message = firsts.input_tokens[user]
    message[turn > 0] = sample_lengths(loop.result_tokens, rows - n, rng, f"{where}.result_tokens")
    prompt = earlier_in_session(message + answers, turn) + message
    gap = between_calls(spec)
    laid = timeline(gap, draw_latencies_ns(gap, rows - n, rng), rows - n)
    between_ns = np.zeros(rows, np.int64)
    between_ns[turn > 0] = laid.post_ns
    detail = {}
    for name, values in laid.detail_ns.items():
        detail[name] = np.zeros(rows, np.int64)
        detail[name][turn > 0] = values
    template = None if firsts.template_tokens is None else firsts.template_tokens[user]
    sessions = Sessions(user, turn, between_ns / 1e9)  # the engine waits think_s after a call's last byte
    made = Requests(firsts.arrival_s[user], prompt.astype(np.int64), answers, None, sessions, template)
    head = None if firsts.prefixes is None else firsts.prefixes.take(user)  # (a shared system prompt)
    made = replace(made, prefixes=session_prefixes(made, head))
    return made, AgentPlan(outer, calls, between_ns, detail)


def check_calls(scenario: Scenario, calls: Requests, deployment: Deployment) -> None:
    """Refuse what the loop's calls cannot run with, in one line: a concurrency cap or disaggregated
    pools (the calls of a request are a closed loop of their own), or a call the deployment cannot hold."""
    model = scenario.application.model.name
    if scenario.workload.max_concurrency is not None:
        raise UserError(f"application: stage {model!r} has a loop, whose calls wait for each other, and does not "
                        "combine with workload.max_concurrency; remove one of them")
    if scenario.deployment.prefill_replicas:
        raise UserError(f"application: stage {model!r} has a loop; disaggregated serving is modelled without one, "
                        "set deployment.prefill_replicas = 0 or remove the loop")
    try:
        check_fits(replace(calls, sessions=None), deployment, scenario)
    except UserError as error:
        raise type(error)(f"{error}; a later call of stage {model!r} carries every call before it: lower its "
                          "loop.turns, result_tokens or call_output") from None


def with_agent(run: Run, plan: AgentPlan) -> Run:
    """The run of the calls (a row each) as the user sees it: a row per request, from the send (its first
    call's scheduled time less the stages before it) to the last stage's end. Queue, compute, traffic and
    delivery are the calls' sums (the front end's parts and the prefix hits too), application the stages
    around and between the calls; what the user reads is the last call's, and the stages after the last
    call are laid out on its stream where the model streams into them."""
    first, last = plan.first, plan.last
    plan = replace(plan, outer=streamed_into(plan.outer, run.e2e_ns[last] - run.ttft_ns[last]))

    def summed(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(values, first)

    send_ns = run.scheduled_ns[first] - plan.outer.pre_ns
    before_last_ns = run.sent_ns[last] - send_ns  # the calls before the last, the stages around them
    e2e = before_last_ns + run.e2e_ns[last] + plan.outer.post_ns
    before_application = plan.outer.pre_ns + summed(plan.between_ns)
    application = before_application + plan.outer.post_ns
    layers = {name: summed(getattr(run, name)) for name in ("compute_ns", "traffic_ns", "delivery_ns")}
    earlier = {name.removesuffix("_ns"): values - getattr(run, name)[last] for name, values in layers.items()}
    earlier["queue"] = summed(run.queue_ns) - run.queue_ns[last]
    shifted = {name: None if getattr(run, name) is None else getattr(run, name)[last] + before_last_ns
               for name in ("ttft_ns", "ttfv_ns", "ttft_engine_ns")}
    fields: dict[str, Any] = {}
    for name in ("network_ns", "frontend_queue_ns", "frontend_work_ns", "engine_host_ns", "prefix_hit_tokens",
                 "engine_input_tokens", "preemptions"):
        fields[name] = None if getattr(run, name) is None else summed(getattr(run, name))
    for name in ("upload_ns", "prefill_start_ns", "engine_done_ns", "replica", "stalls", "stall_ns", "qoe"):
        fields[name] = None if getattr(run, name) is None else getattr(run, name)[last]
    tokens = None if run.token_client_ns is None else run.token_client_ns[token_rows(run.token_offsets, last)]
    output = run.output_tokens[last]
    stages = {**plan.outer.detail_ns, **{stage: summed(v) for stage, v in plan.between_detail_ns.items()}}
    return replace(
        run, **fields, **shifted, **layers, scheduled_ns=send_ns, sent_ns=send_ns,
        input_tokens=summed(run.input_tokens), output_tokens=output, e2e_ns=e2e,
        queue_ns=e2e - sum(layers.values()) - application, token_client_ns=tokens,
        token_offsets=np.concatenate([[0], np.cumsum(output)]).astype(np.int64), application_ns=application,
        application_detail_ns=stages, application_before_ns=before_application, model_sent_ns=run.sent_ns[last],
        earlier_calls_ns=earlier, model_calls=plan.calls, model_call_output_tokens=summed(run.output_tokens),
        request_index=plan.outer.request_index)


def last_calls(calls: Requests, plan: AgentPlan) -> Requests:
    """The requests one row per user request, as the run after `with_agent`: each request's last call."""
    return replace(calls, sessions=None, prefixes=None).take(plan.last)
