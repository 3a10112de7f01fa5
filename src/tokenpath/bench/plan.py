"""From a scenario to the requests a bench run sends: the workload simulate would draw, as prompts.

The workload (lengths, arrival times) is drawn exactly as `simulate` draws it from the same scenario,
so a measured and a simulated run describe the same requests. Each prompt is built to the drawn input
length with the tokenizer; `max_tokens` is the drawn output length, and `ignore_eos` asks the server
to generate all of it. Requests the workload says share a prefix share its text (prompts.py).

Multi-turn sessions (`[workload.sessions]`) are sent for real: each turn's new message is built to its
drawn length up front, and the client chains the turns (runner.SessionPlan): turn k+1 goes its think
time after turn k's last byte, its prompt turn k's prompt + the server's answer text + the new
message. Its input tokens are then counted on the text actually sent, not taken from the draw.
"""

from __future__ import annotations

import datetime as dt
import http.client
import math
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import numpy as np
import orjson

from tokenpath.bench.http import KERNEL_TIMESTAMPS, Endpoint
from tokenpath.bench.prompts import PromptBuilder
from tokenpath.bench.results import RESULTS_SCHEMA, SLO_KEYS
from tokenpath.bench.runner import Plan, SessionPlan, auto_workers
from tokenpath.bench.stream import MAX_EVENT_BYTES
from tokenpath.bench.tokenizer import Tokenizer
from tokenpath.config.errors import UserError, quoted
from tokenpath.sim.scenario import Scenario
from tokenpath.workload import Requests, generate

# The random streams simulate derives from the scenario seed: the workload is stream 0. Prompt
# starting points use a stream of their own, so they never shift the workload's draws.
_WORKLOAD_STREAM, _PROMPT_STREAM = 0, 2
Api = Literal["completions", "chat"]


@dataclass(frozen=True)
class Target:
    """The server and how to talk to it."""

    base_url: str
    model: str
    endpoint: Api = "completions"
    api_key: str | None = None
    strict_openai: bool = False       # only standard OpenAI fields: no ignore_eos, no per-event usage
    extra_body: dict[str, Any] = field(default_factory=dict)

    def url(self) -> str:
        base = self.base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + ("/completions" if self.endpoint == "completions" else "/chat/completions")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def workload_requests(scenario: Scenario) -> Requests:
    """The requests of the scenario, drawn as `simulate` draws them."""
    seeds = np.random.SeedSequence(scenario.seed).spawn(_PROMPT_STREAM + 1)
    return generate(_workload(scenario), np.random.default_rng(seeds[_WORKLOAD_STREAM]))


def _workload(scenario: Scenario):
    """The workload with file paths resolved against the scenario's folder, its prompts as the client
    sends them: a chat server adds its template's tokens itself."""
    resolved = getattr(scenario, "resolved_workload", None)
    workload = resolved(chat_template=False) if resolved is not None else scenario.workload
    return workload.model_copy(update={"chat_template_tokens": 0})


def prompt_rng(scenario: Scenario) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(scenario.seed).spawn(_PROMPT_STREAM + 1)[_PROMPT_STREAM])


def request_body(target: Target, prompt: str | list[dict[str, str]], max_tokens: int) -> bytes:
    """The JSON body of one request; `prompt` is a text, or for chat optionally the whole message history."""
    body: dict[str, Any] = {"model": target.model, "stream": True, "max_tokens": int(max_tokens)}
    if target.endpoint == "completions":
        body["prompt"] = prompt
    else:
        body["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if target.strict_openai:
        body["stream_options"] = {"include_usage": True}
    else:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        body["ignore_eos"] = True
    body.update(target.extra_body)
    return orjson.dumps(body)


def build_plan(scenario: Scenario, target: Target, tokenizer: Tokenizer, tokenizer_name: str,
               requests: Requests | None = None, timeouts: dict[str, float | None] | None = None,
               prompt_tag: str | None = None, kernel_timestamps: bool = True,
               max_event_bytes: int = MAX_EVENT_BYTES, unique_prompts: bool = True) -> tuple[Plan, dict[str, Any]]:
    """The plan (bodies and send schedule) and the results header for a scenario against a target.

    `unique_prompts` tags each prompt's own text (after any shared prefix) and each shared segment
    with this run's tag, so a server's prefix cache finds only what the workload shares."""
    requests = requests if requests is not None else workload_requests(scenario)
    builder = PromptBuilder(tokenizer)
    tag = prompt_tag if prompt_tag is not None else os.urandom(3).hex() + "-"
    sessions = None
    if requests.sessions is not None:
        messages = builder.build_many(message_tokens(requests), prompt_rng(scenario), tag, None, unique_prompts)
        sessions = SessionPlan(requests.sessions.session, requests.sessions.turn,
                               np.rint(requests.sessions.think_s * 1e9).astype(np.int64), messages,
                               partial(request_body, target), partial(_count_tokens, tokenizer),
                               target.endpoint == "chat")
        bodies = []  # built as each turn is sent
    else:
        prompts = builder.build_many(requests.input_tokens, prompt_rng(scenario), tag, requests.prefixes,
                                     unique_prompts)
        bodies = [request_body(target, prompt, out) for prompt, out in zip(prompts, requests.output_tokens.tolist())]
    plan = Plan(
        url=target.url(),
        bodies=bodies,
        scheduled_ns=np.rint(requests.arrival_s * 1e9).astype(np.int64),
        input_tokens=requests.input_tokens,
        output_tokens=requests.output_tokens,
        max_concurrency=scenario.workload.max_concurrency,
        headers=target.headers(),
        kernel_timestamps=kernel_timestamps,
        max_event_bytes=max_event_bytes,
        sessions=sessions,
        **(timeouts or {}),
    )
    header = {
        "schema": RESULTS_SCHEMA,
        "kind": "header",
        "scenario": {"name": scenario.name, "fingerprint": scenario.fingerprint(),
                     "table": scenario.model_dump(mode="json")},
        "slo": {key: getattr(scenario.slo, key) for key in SLO_KEYS},
        "planned": len(requests),
        "base_url": target.base_url,
        "url": plan.url,
        "model": target.model,
        "endpoint": target.endpoint,
        "strict_openai": target.strict_openai,
        "tokenizer": tokenizer_name,
        "prompt_tag": tag if unique_prompts else None,
        "unique_prompts": unique_prompts,
        "shared_prefix_requests": (0 if requests.prefixes is None or requests.sessions is not None
                                   else int((requests.prefixes.tokens > 0).sum())),
        "sessions": None if requests.sessions is None else int(len(np.unique(requests.sessions.session))),
        "timeouts_s": {"connect": plan.connect_timeout_s, "stall": plan.stall_timeout_s,
                       "request": plan.request_timeout_s, "run": plan.run_timeout_s},
        "max_event_bytes": plan.max_event_bytes,
        "timestamps": ("kernel" if plan.kernel_timestamps and KERNEL_TIMESTAMPS and plan.url.startswith("http:")
                       else "event loop"),
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return plan, header


def message_tokens(requests: Requests) -> np.ndarray:
    """Each session turn's new message length: its drawn prompt less the previous turn's prompt and answer
    (workload.generate.sessions builds prompt[k] = prompt[k-1] + answer[k-1] + message[k])."""
    turn = requests.sessions.turn
    inputs, outputs = requests.input_tokens, requests.output_tokens
    before = np.concatenate(([0], inputs[:-1] + outputs[:-1])).astype(np.int64)
    return np.where(turn > 0, inputs - before, inputs)


def _count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text))


def default_workers(scenario: Scenario, requests: Requests) -> int:
    workload = _workload(scenario)
    rate = workload.arrival.rate if workload.trace is None else _trace_rate(requests)
    return auto_workers(rate, float(requests.output_tokens.mean()) if len(requests) else 0.0,
                        scenario.workload.max_concurrency, len(requests))


def _trace_rate(requests: Requests) -> float:
    span = float(requests.arrival_s[-1] - requests.arrival_s[0]) if len(requests) > 1 else 0.0
    return (len(requests) - 1) / span if span > 0 else math.inf


def preflight(target: Target, timeout_s: float) -> None:
    """One-line errors before a run: the server cannot be reached, refuses the key, or lacks the model."""
    endpoint = Endpoint.parse(target.base_url)
    base = target.base_url.rstrip("/")
    models_url = (base if base.endswith("/v1") else base + "/v1") + "/models"
    request = urllib.request.Request(models_url, headers={**target.headers(), "Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            listing = response.read(1 << 20)
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            raise UserError(f"{models_url}: the server refused the API key (HTTP {error.code}); "
                            "set it with --api-key-env VAR") from None
        return  # no model list on this server: nothing to check
    except http.client.HTTPException as error:  # bytes that are not an HTTP response (e.g. http to a TLS port)
        answer = getattr(error, "line", None) or str(error) or error.__class__.__name__
        raise UserError(f"{models_url}: the server did not answer in HTTP ({error.__class__.__name__}: "
                        f"{quoted(answer)}); give --base-url the server's HTTP address, e.g. "
                        "http://127.0.0.1:8000 (https:// for TLS)") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        reason = getattr(reason, "strerror", None) or str(reason)
        raise UserError(f"cannot reach {endpoint.url()}: {reason}; is the server running at --base-url?") from None
    try:
        served = [entry["id"] for entry in orjson.loads(listing)["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return
    if served and target.model not in served:
        raise UserError(f"--model {quoted(target.model)}: the server does not serve it; "
                        f"it serves: {', '.join(quoted(name) for name in served[:10])}")


# The fields request_body sets itself, and where each comes from instead: an --extra-body giving one would
# replace it in every request, unseen by the results file.
_OWN_FIELDS = {
    "model": "give --model instead",
    "stream": "bench always streams, to time each token",
    "max_tokens": "output lengths come from the workload (--output-len)",
    "max_completion_tokens": "output lengths come from the workload (--output-len)",
    "prompt": "prompts come from the workload",
    "messages": "prompts come from the workload",
    "stream_options": "bench asks for the usage it reads",
    "ignore_eos": "bench sets it to hold each output to its drawn length (with --strict-openai it does not, and "
                  "--extra-body may)",
}


def parse_extra_body(text: str | None, strict_openai: bool = False) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise UserError(f"--extra-body: not JSON ({error}); give an object like '{{\"temperature\": 0}}'") from None
    if not isinstance(value, dict):
        raise UserError("--extra-body: give a JSON object like '{\"temperature\": 0}'")
    for key in value:
        if key in _OWN_FIELDS and not (key == "ignore_eos" and strict_openai):
            raise UserError(f"--extra-body: {quoted(key)} is a field bench sets itself ({_OWN_FIELDS[key]}); "
                            "remove it")
    return value

