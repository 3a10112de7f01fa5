"""The delivery-time model: from a request's bytes to the engine, and from a token sampled on the
device to its text at the client.

A request crosses the network (half a round trip plus its bytes), then waits its turn at the server's
front end (delivery/frontend.py), which parses it, renders its chat template and tokenizes it (in a
batch of prompts, where the engine's release batches them) before the engine sees it. Per engine step
the sampled ids are copied to the host, which blocks the next step; they are detokenized where the
engine does it (in its own process, blocking the next step too; in the API server; or in a detokenizer
process of its own, whose text the API server then takes in) and each chunk is framed as an SSE event in
the API server, at the constant costs of the spec or at this machine's measured cost per batch size when
the spec names a calibration file from `tokenpath calibrate delivery`. A step's tokens leave when the
front end is done with them. Each event then crosses the network: half a round trip plus its bytes over
the client's bandwidth.

Events group tokens: the first token is sent at once, later ones in groups of `stream_interval`, and the
last group is flushed when the sequence ends. All times are integer nanoseconds, so the per-request
attribution sums exactly.
"""

from __future__ import annotations

import numpy as np

from tokenpath.delivery.calibration import CalibratedCost
from tokenpath.delivery.frontend import FrontEnd, Layout, Wait
from tokenpath.delivery.spec import DeliverySpec

ID_BYTES = 4  # one sampled token id (int32) copied to the host


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def closes_event(token_index: np.ndarray, output_tokens: np.ndarray, interval: int) -> np.ndarray:
    """True where token `token_index` (0-based) of a sequence is the last one of its SSE event."""
    return (token_index == 0) | (token_index % interval == 0) | (token_index == output_tokens - 1)


def event_sizes(output_tokens: int, interval: int) -> tuple[int, int]:
    """(tokens in the first event, tokens in the last event) of a sequence."""
    if output_tokens == 1:
        return 1, 1
    tail = (output_tokens - 1) % interval
    return 1, tail if tail else interval


class LastMile:
    """Delivery costs for the engine loop (per request and per step) and for the stream (per token),
    for one engine replica whose front end is laid out as `layout` says."""

    def __init__(self, spec: DeliverySpec, layout: Layout | None = None, model_front_end: bool = True) -> None:
        """`layout`: the front end's processes (None: one, detokenizing where the spec says, else in the
        engine). `model_front_end`: model its processes; without (a server that runs its own, as `serve`
        does), only the engine's side is: the copy, and detokenizing where the engine does it."""
        layout = layout or Layout(spec.detokenize or "engine")
        self.spec, self.layout, self.models_front_end = spec, layout, model_front_end
        self.front_end = FrontEnd(layout, spec.tokenizer_batch_wait or 0.0, spec.tokenizer_batch_max)
        self._half_rtt_ns = _ns(spec.network_rtt / 2)
        # Per-step costs, precomputed: on_step runs once per engine step.
        self._copy_fixed_ns = spec.host_link_latency * 1e9
        self._copy_per_id_ns = ID_BYTES / spec.host_link_bw * 1e9
        self._detokenize_s, self._output_s, self._frame_s = (spec.detokenize_per_token, spec.output_per_token,
                                                             spec.frame_per_event)
        # Whether the engine hands on each event's outputs, not each token's (Layout.outputs_per_event), with
        # several tokens to an event. (Speculative decoding's events of a step's tokens, with one token an
        # event otherwise, keep their per-token cost.)
        self.outputs_per_event = layout.outputs_per_event and spec.stream_interval > 1
        # A measured calibration, read once here: on_step runs every engine step.
        self._calibrated = (CalibratedCost.from_file(spec.calibration, spec.calibrated_server)
                            if spec.calibration else None)
        # A request's front-end stages (`request_stages_s`): as it arrives, and once that is done, plus
        # per prompt token; the calibration's measured pieces where it has them.
        request = None if self._calibrated is None else self._calibrated.request_stages_s()
        self._first_s, self._then_s, self._tokenize_s = request or (
            spec.frontend_per_request, spec.chat_template_per_request, spec.tokenize_per_token)
        # An engine release that reads the template's source again per request (engine/template_work.py) does
        # it in the first stage: vLLM's _preprocess_chat parses it before the request's first await (its
        # tokenizing, in an executor), so a burst's requests all pay it before any reaches the engine.
        self._first_s += spec.chat_template_parse_per_request or 0.0
        # Whether requests and tokens take any front-end time: without, the engine loop skips it.
        costs = (self._first_s, self._then_s, self._tokenize_s, spec.frame_per_event, spec.detokenize_per_token,
                 spec.output_per_token, spec.tokenizer_batch_wait)
        self.queues_requests = model_front_end and bool(any(costs) or self._calibrated)

    def upload_ns(self, input_tokens: int) -> int:
        """Client -> server: half a round trip plus the request's bytes (its front-end time is queued
        when it arrives: `request`)."""
        return self.network_ns(self.spec.request_overhead_bytes + self.spec.bytes_per_token * input_tokens)

    def request_stages_s(self, input_tokens: int) -> tuple[float, float]:
        """The front end's CPU time for one request in its two stages: as it arrives (read and parse it;
        the spec's frontend_per_request, and its chat template's source where the engine's release parses
        it again), and then (its chat template, tokenizing its prompt, the hand-off to the engine); the
        calibration's measured pieces where it has them."""
        return self._first_s, self._then_s + input_tokens * self._tokenize_s

    def tokenize_s(self, input_tokens: int) -> float:
        """The part of a request's front-end time that tokenizes its prompt (in `request_stages_s`'s second)."""
        return input_tokens * self._tokenize_s

    def request_cost_s(self, input_tokens: int) -> float:
        """The front end's whole CPU time for one request (`request_stages_s`, summed)."""
        return sum(self.request_stages_s(input_tokens))

    def requests(self, arrival_ns: list[int], input_tokens: list[int]) -> list[Wait]:
        """Requests that reached the server by one moment of the engine loop (`arrival_ns`, in order)
        through the front end: for each, (when the engine sees it, its wait, its work there)."""
        return self.front_end.requests(arrival_ns, self._first_s, [self._then_s] * len(arrival_ns),
                                       [self.tokenize_s(n) for n in input_tokens])

    def request(self, arrival_ns: int, input_tokens: int) -> Wait:
        """`requests` for one request, the only one that reached the server by that moment."""
        return self.front_end.request(arrival_ns, self._first_s, self._then_s, self.tokenize_s(input_tokens))

    def network_ns(self, size_bytes: float) -> int:
        """One message of `size_bytes` over the client's network, either way: half a round trip plus
        its bytes at the network's bandwidth (the model of `upload_ns` and `event_network_ns`)."""
        return self._half_rtt_ns + _ns(size_bytes / self.spec.network_bw)

    def event_network_ns(self, tokens_in_event: np.ndarray | int) -> np.ndarray | int:
        """Server -> client time of one SSE event carrying `tokens_in_event` tokens."""
        size_bytes = self.spec.event_overhead_bytes + self.spec.bytes_per_token * np.asarray(tokens_in_event)
        network_ns = self._half_rtt_ns + np.rint(size_bytes / self.spec.network_bw * 1e9).astype(np.int64)
        return int(network_ns) if np.ndim(network_ns) == 0 else network_ns

    @property
    def stream_interval(self) -> int:
        return self.spec.stream_interval

    def host_costs_s(self, emitted: int, events: int) -> tuple[float, float]:
        """(detokenizing, the API server's other work) in seconds for a step's `emitted` tokens in `events`
        SSE events: the spec's constants (taking in outputs detokenized elsewhere, per token, and framing,
        per event; the per-token work per event where the engine hands on events, `_outputs_per_event`), or
        the calibration's measured framing for the batch size, with its detokenizing where it prices this
        package's server (an engine's per-token work stays the spec's: calibration.py)."""
        outputs = events if self.outputs_per_event else emitted
        if self._calibrated is None:
            return outputs * self._detokenize_s, outputs * self._output_s + events * self._frame_s
        framing_s = self._calibrated.frame_s(emitted, events)
        if self._calibrated.prices_engine:
            return outputs * self._detokenize_s, outputs * self._output_s + framing_s
        return self._calibrated.host_s(emitted, events) - framing_s, framing_s

    def framing_s(self, emitted: int, events: int) -> float:
        """The part of a step's API-server work (`host_costs_s`) that builds and writes its `events` SSE
        events: what a step whose outputs merge into the step before's events does not pay
        (FrontEnd.tokens)."""
        return events * self._frame_s if self._calibrated is None else self._calibrated.frame_s(emitted, events)

    def on_step(self, gpu_end_ns: int, emitted: int, events: int) -> tuple[int, int, int, int]:
        """Account one step that sampled `emitted` tokens, closing `events` SSE events.

        Returns (blocking_ns, leave_ns, front_queue_ns, front_work_ns): how long the step is extended
        before the next one can start (the ids' copy, and detokenizing when the engine does it), when
        this step's tokens leave the server, and how long they waited for and ran on the front end's
        processes on the way.
        """
        if emitted == 0:
            return 0, gpu_end_ns, 0, 0
        copy_ns = round(self._copy_fixed_ns + emitted * self._copy_per_id_ns)
        where = self.layout.detokenizes_in
        if self._calibrated is None:  # (host_costs_s and framing_s, inline: this runs every engine step)
            outputs = events if self.outputs_per_event else emitted
            frame_s = events * self._frame_s
            detokenize_s, api_s = outputs * self._detokenize_s, outputs * self._output_s + frame_s
        else:
            detokenize_s, api_s = self.host_costs_s(emitted, events)
            frame_s = self.framing_s(emitted, events)
        if not self.models_front_end:
            engine_ns = round(detokenize_s * 1e9) if where == "engine" else 0
            return copy_ns + engine_ns, gpu_end_ns + copy_ns + engine_ns, 0, 0
        if where == "api-server":
            done_ns, queue_ns, work_ns = self.front_end.tokens(gpu_end_ns + copy_ns, detokenize_s + api_s, emitted,
                                                               frame_s)
            return copy_ns, done_ns, queue_ns, work_ns
        if where == "engine":
            blocking_ns = copy_ns + round(detokenize_s * 1e9)
            done_ns, queue_ns, work_ns = self.front_end.tokens(gpu_end_ns + blocking_ns, api_s, emitted, frame_s)
            return blocking_ns, done_ns, queue_ns, work_ns
        detokenized_ns, detokenize_queue_ns, detokenize_work_ns = self.front_end.detokenize(gpu_end_ns + copy_ns,
                                                                                             detokenize_s)
        done_ns, queue_ns, work_ns = self.front_end.tokens(detokenized_ns, api_s, emitted, frame_s)
        return copy_ns, done_ns, detokenize_queue_ns + queue_ns, detokenize_work_ns + work_ns

    def steps_blocking_ns(self, emitted: int, events: int) -> int | None:
        """on_step's blocking_ns for steps that each sample `emitted` (>= 1) tokens in `events` events, where
        on_steps can account a run of them (None where the front end has several API-server processes, whose
        turns are left to on_step)."""
        where = self.layout.detokenizes_in
        if self.models_front_end and not self.front_end.single_process:
            return None
        copy_ns = round(self._copy_fixed_ns + emitted * self._copy_per_id_ns)
        return copy_ns + round(self.host_costs_s(emitted, events)[0] * 1e9) if where == "engine" else copy_ns

    def on_steps(self, gpu_end_ns: np.ndarray, emitted: int, events: int) -> tuple[np.ndarray, np.ndarray,
                                                                                    np.ndarray]:
        """on_step for a run of steps that each sample `emitted` tokens in `events` events, where
        steps_blocking_ns says it can, ending on the GPU at `gpu_end_ns` (in order): each one's (leave_ns,
        front_queue_ns, front_work_ns), exactly as on_step gives them step by step."""
        blocking_ns = self.steps_blocking_ns(emitted, events)
        if not self.models_front_end:
            zeros = np.zeros(len(gpu_end_ns), np.int64)
            return gpu_end_ns + blocking_ns, zeros, zeros
        detokenize_s, api_s = self.host_costs_s(emitted, events)
        frame_s = self.framing_s(emitted, events)
        where = self.layout.detokenizes_in
        if where == "api-server":
            return self.front_end.tokens_run(gpu_end_ns + blocking_ns, detokenize_s + api_s, frame_s)
        if where == "engine":
            return self.front_end.tokens_run(gpu_end_ns + blocking_ns, api_s, frame_s)
        detokenized_ns, detokenize_queue_ns, detokenize_work_ns = self.front_end.detokenize_run(
            gpu_end_ns + blocking_ns, detokenize_s)
        done_ns, queue_ns, work_ns = self.front_end.tokens_run(detokenized_ns, api_s, frame_s)
        return done_ns, detokenize_queue_ns + queue_ns, detokenize_work_ns + work_ns

    def busy_ns(self) -> dict[str, int]:
        """How long the front end's busiest API-server process, and its tokenizer thread and detokenizer
        process where it has them, have been busy so far."""
        if not self.models_front_end:
            return {}
        busy = {"API server": self.front_end.api_busy_ns}
        if self.layout.tokenizes_in_thread:
            busy["tokenizer thread"] = self.front_end.tokenizer_busy_ns
        if self.layout.detokenizes_in == "detokenizer":
            busy["detokenizer"] = self.front_end.detokenizer_busy_ns
        return busy

    def last_event_arrival_ns(self, leave_ns: int, output_tokens: int) -> int:
        """When the client has the last byte of a sequence whose last token left at `leave_ns`."""
        return leave_ns + self.event_network_ns(event_sizes(output_tokens, self.spec.stream_interval)[1])

    def client_times_ns(self, leave_ns: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Per-token arrival at the client, given per-token leave times (flat, rows split by offsets).

        A token arrives with its event: when the event's last token has left, plus the event's
        network time.
        """
        interval = self.spec.stream_interval
        if interval == 1:  # every token is its own event
            return leave_ns + self.event_network_ns(1)
        output_tokens = np.diff(offsets)
        request = np.repeat(np.arange(len(output_tokens)), output_tokens)
        token_index = np.arange(len(leave_ns)) - offsets[request]
        event = np.where(token_index == 0, 0, 1 + (token_index - 1) // interval)
        last_event = np.where(output_tokens == 1, 0, 1 + (output_tokens - 2) // interval)
        # The index of the token that closes each token's event, within its sequence.
        closer = np.where(event == 0, 0, np.minimum(event * interval, output_tokens[request] - 1))
        tokens_in_event = np.where(
            event == 0, 1,
            np.where(event == last_event[request], output_tokens[request] - 1 - (event - 1) * interval, interval),
        )
        send_ns = leave_ns[offsets[request] + closer]
        return send_ns + self.event_network_ns(tokens_in_event)


def first_visible_index(output_tokens: np.ndarray, invisible_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Index of each sequence's first token that shows a visible character.

    Tokens that are not a whole UTF-8 character alone show nothing until a later token completes
    them; with a share `invisible_fraction` of such tokens the run before the first visible one is
    geometric. A sequence with no visible token shows its flushed tail (U+FFFD) at its last token.
    """
    if invisible_fraction == 0:
        return np.zeros(len(output_tokens), dtype=np.int64)
    leading_invisible = rng.geometric(1.0 - invisible_fraction, size=len(output_tokens)) - 1
    return np.minimum(leading_invisible, output_tokens - 1).astype(np.int64)
