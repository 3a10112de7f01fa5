"""The delivery-time model: from a token sampled on the device to its text at the client.

Per engine step the sampled ids are copied to the host, detokenized and framed as SSE events (at the
constant costs of the spec, or at this machine's measured cost per batch size when the spec names a
calibration file from `tokenpath calibrate delivery`). Inline,
that host work blocks the next step; async, a separate worker does it while the device runs on, and a
step's tokens leave when the worker reaches them. Each event then crosses the network: half a round
trip plus its bytes over the client's bandwidth.

Events group tokens: the first token is sent at once, later ones in groups of `stream_interval`, and
the last group is flushed when the sequence ends. All times are integer nanoseconds, so the
per-request attribution sums exactly.
"""

from __future__ import annotations

import numpy as np

from tokenpath.delivery.calibration import CalibratedCost
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
    """Delivery costs for the engine loop (per step) and for the stream (per token)."""

    def __init__(self, spec: DeliverySpec) -> None:
        self.spec = spec
        self._worker_free_ns = 0
        self._half_rtt_ns = _ns(spec.network_rtt / 2)
        self._frontend_ns = _ns(spec.frontend_per_request)
        # Per-step costs in ns, precomputed: on_step runs once per engine step.
        self._inline = spec.detokenize == "inline"
        self._copy_fixed_ns = spec.host_link_latency * 1e9
        self._copy_per_id_ns = ID_BYTES / spec.host_link_bw * 1e9
        self._detokenize_ns = spec.detokenize_per_token * 1e9
        self._frame_ns = spec.frame_per_event * 1e9
        # A measured calibration, read once here: on_step runs every engine step.
        self._calibrated = CalibratedCost.from_file(spec.calibration) if spec.calibration else None

    def upload_ns(self, input_tokens: int) -> int:
        """Client -> engine: half a round trip plus the request's bytes, then the server's front end."""
        return self.upload_network_ns(input_tokens) + self._frontend_ns

    def upload_network_ns(self, input_tokens: float) -> int:
        """The network's part of the upload: half a round trip plus the request's bytes."""
        return self.network_ns(self.spec.request_overhead_bytes + self.spec.bytes_per_token * input_tokens)

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

    def on_step(self, gpu_end_ns: int, emitted: int, events: int) -> tuple[int, int]:
        """Account one step that sampled `emitted` tokens, closing `events` SSE events.

        Returns (blocking_ns, leave_ns): how long the step is extended before the next one can start,
        and when this step's tokens leave the server.
        """
        if emitted == 0:
            return 0, gpu_end_ns
        copy_ns = round(self._copy_fixed_ns + emitted * self._copy_per_id_ns)
        if self._calibrated is None:
            host_ns = round(emitted * self._detokenize_ns + events * self._frame_ns)
        else:
            host_ns = self._calibrated.host_ns(emitted, events)
        if self._inline:
            blocking_ns = copy_ns + host_ns
            return blocking_ns, gpu_end_ns + blocking_ns
        self._worker_free_ns = max(self._worker_free_ns, gpu_end_ns + copy_ns) + host_ns
        return copy_ns, self._worker_free_ns

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


def worker_busy_ns(ready_ns: np.ndarray, leave_ns: np.ndarray) -> int:
    """How long the async detokenizing worker was busy, from each step's time its ids reached the host
    (`ready_ns`, time order) and the time its tokens left (`leave_ns`; -1: nothing left then).

    The worker takes steps first come first served (`LastMile.on_step`), so a step's work starts when
    both its ids and the worker are ready, and ends when its tokens leave.
    """
    leaving = leave_ns >= 0
    ready, leave = ready_ns[leaving], leave_ns[leaving]
    if not len(leave):
        return 0
    free_before = np.concatenate([[ready[0]], np.maximum.accumulate(leave)[:-1]])
    return int(np.maximum(0, leave - np.maximum(ready, free_before)).sum())
