"""A model that streams its answer into the stages after it (`stream_into_next`, docs/application.md):
the stages directly after the model start on its first token at the client instead of its last, and
one that reads the stream ends at max(its start + its time, the stream's last token): a consumer that
keeps up with the stream cannot finish before the text it works on has arrived.

Where those stages end then depends on each request's stream (its last token less its first), known
only when the run is done, so they are laid out then (`streamed_into`); the stages before the model
are laid out before the run as always.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tokenpath.application.spec import ApplicationSpec
from tokenpath.application.timeline import Timeline, timeline


@dataclass(frozen=True)
class Streamed:
    """The model call and the stages after it (`spec`: their `after` without the stages before the
    model, done by the first token), and those stages' drawn times per request."""

    spec: ApplicationSpec
    latency_ns: dict[str, np.ndarray]

    def take(self, rows: np.ndarray) -> Streamed:
        return Streamed(self.spec, {name: values[rows] for name, values in self.latency_ns.items()})


def streaming(spec: ApplicationSpec, latency_ns: dict[str, np.ndarray], laid: Timeline) -> Timeline:
    """`laid` (spec's layout of `latency_ns`) carrying the stages after the model to lay out once the run
    is done, where the model streams into them; else `laid` as it is."""
    model = spec.model
    before, between = spec.before_model(), set(spec.between())
    after = [stage for stage in spec.stages if stage is not model and stage.name not in before | between]
    if not model.stream_into_next or not after:
        return laid
    call = model.model_copy(update={"after": [], "needs": None, "prompt": None, "loop": None})
    stages = [stage.model_copy(update={"after": [name for name in stage.after if name not in before],
                                       "needs": None}) for stage in after]
    return replace(laid, streamed=Streamed(ApplicationSpec(stages=[call, *stages]),
                                           {stage.name: latency_ns[stage.name] for stage in after}))


def streamed_into(laid: Timeline, stream_length_ns: np.ndarray) -> Timeline:
    """`laid` with the stages after the model laid out from each request's first token, given its
    stream's length (its last token less its first at the client): `post_ns` the time from the last
    token to the last stage's end, and the stages' shares of it."""
    if laid.streamed is None:
        return laid
    after = timeline(laid.streamed.spec, laid.streamed.latency_ns, len(stream_length_ns),
                     stream_length_ns=stream_length_ns)
    model = laid.streamed.spec.model.name
    start = None if laid.start_ns is None else {
        **laid.start_ns, **{name: values for name, values in after.start_ns.items() if name != model}}
    return replace(laid, post_ns=after.post_ns, detail_ns={**laid.detail_ns, **after.detail_ns}, start_ns=start,
                   streamed=None)
