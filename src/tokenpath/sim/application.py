"""The application around the model call, composed with the simulated deployment: the engine sees each
request when the stages before the model are done (later than the user's send, with a longer prompt),
and the client-side times are then counted from the user's send to the last stage's end, the time in
the stages on the request's critical path its own layer, `application` (application/timeline.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from tokenpath.application.service import queues
from tokenpath.application.spec import ApplicationSpec
from tokenpath.application.stream import streamed_into, streaming
from tokenpath.application.timeline import Timeline, draw_latencies_ns, timeline
from tokenpath.config.assumptions import DEFAULTS, Assumptions
from tokenpath.config.errors import UserError
from tokenpath.sim.agent import AgentPlan, agent_calls, around_loop, with_agent
from tokenpath.sim.run import Run
from tokenpath.workload import Requests, WorkloadSpec


def check_alone(requests: Requests) -> None:
    if requests.sessions is not None:
        raise UserError("application: multi-turn sessions with an [application] table are not modelled yet; "
                        "remove [workload.sessions] or [application]")


def question_tokens(requests: Requests, workload: WorkloadSpec) -> np.ndarray:
    """Per request, the user's question as a served embed or rerank stage reads it: the drawn input,
    without the chat template (the LLM server adds it to the model's prompt) or a
    `[workload.shared_prefix]` (a system prompt the application puts before the model's prompt). A
    trace's prompt is taken whole: it does not tell its parts apart."""
    question = requests.client_input_tokens
    if workload.trace is None and workload.shared_prefix is not None and requests.prefixes is not None:
        question = question - requests.prefixes.tokens
    return question


def upload_times_ns(upload_ns: Callable[[int], int] | None, prompt_tokens: np.ndarray) -> np.ndarray:
    """Each model call's way from the client to the server (`upload_ns` of its prompt: LastMile.upload_ns, as
    the engine times it), once per distinct length; zeros without one."""
    if upload_ns is None:
        return np.zeros(len(prompt_tokens), np.int64)
    lengths, which = np.unique(prompt_tokens, return_inverse=True)
    return np.array([upload_ns(int(n)) for n in lengths], np.int64)[which]


def model_calls(spec: ApplicationSpec, requests: Requests, rng: np.random.Generator,
                assumptions: Assumptions = DEFAULTS, question: np.ndarray | None = None,
                upload_ns: Callable[[int], int] | None = None) -> tuple[Requests, Timeline | AgentPlan]:
    """The requests as the model call sends them, in the order they reach the server: each user send
    delayed by the stages before the model, each prompt grown by the model stage's template and chunks;
    and each request's timeline, in that order. With an agent loop, every call of each request
    (sim/agent.py). Stages served on queues of their own are timed under `assumptions`
    (application/service.py) on each request's `question` tokens (`question_tokens`; unset, the
    client's prompt). The stages run beside the server: their queues take each request once it has
    reached the server, its send plus `upload_ns` of its prompt (the engine's own upload, which the model
    call then pays in the engine as it reaches it), so a client further away moves every server-side
    event of a request alike."""
    check_alone(requests)
    if spec.model.loop is not None:
        return agent_calls(spec, *model_calls(around_loop(spec), requests, rng, assumptions, question, upload_ns),
                           rng)
    n = len(requests)
    send_ns = np.rint(requests.arrival_s * 1e9).astype(np.int64)
    latency_ns = draw_latencies_ns(spec, n, rng)
    question = requests.client_input_tokens if question is None else question
    prompt = spec.model.prompt
    added = 0 if prompt is None else prompt.added_tokens
    reach_ns = send_ns + upload_times_ns(upload_ns, requests.input_tokens + added)
    laid = timeline(spec, latency_ns, n, queues(spec, reach_ns, question, assumptions))
    laid = streaming(spec, latency_ns, laid)
    call_ns = send_ns + laid.pre_ns
    order = np.argsort(call_ns, kind="stable")
    prefixes, template = requests.prefixes, requests.template_tokens
    moved = Requests(call_ns[order] / 1e9, requests.input_tokens[order] + added, requests.output_tokens[order],
                     None if prefixes is None else prefixes.take(order), None,
                     None if template is None else template[order])
    laid = Timeline(laid.pre_ns[order], laid.post_ns[order], {k: v[order] for k, v in laid.detail_ns.items()},
                    streamed=None if laid.streamed is None else laid.streamed.take(order), request_index=order)
    return moved, laid


def with_application(run: Run, laid: Timeline | AgentPlan) -> Run:
    """The run as the user sees it: from their send (the model call's scheduled time less the stages
    before it) to the last stage's end. A model call held back by a concurrency cap waits in `queue`. A
    model streaming into the stages after it has them laid out here, on each request's stream."""
    if isinstance(laid, AgentPlan):
        return with_agent(run, laid)
    laid = streamed_into(laid, run.e2e_ns - run.ttft_ns)
    user_send_ns = run.scheduled_ns - laid.pre_ns
    before_ns = run.sent_ns - user_send_ns  # the stages before the model, and any wait for a free slot
    shift = lambda values: None if values is None else values + before_ns  # noqa: E731
    return replace(
        run, scheduled_ns=user_send_ns, sent_ns=user_send_ns, ttft_ns=shift(run.ttft_ns), ttfv_ns=shift(run.ttfv_ns),
        ttft_engine_ns=shift(run.ttft_engine_ns), e2e_ns=run.e2e_ns + before_ns + laid.post_ns,
        queue_ns=run.queue_ns + before_ns - laid.pre_ns, application_ns=laid.pre_ns + laid.post_ns,
        application_detail_ns=laid.detail_ns, application_before_ns=laid.pre_ns, model_sent_ns=run.sent_ns,
        request_index=laid.request_index)
