"""A stage served on the deployment's own GPU (`served.on = "shared"`, docs/application.md): its jobs run
inside the engine's steps (engine/side_work.py), so when each model call is sent is known only as the
engine runs.

The stages are laid out before the run with the shared stage's time first far below, then far above,
any real one. A stage's end is the latest end of its `after` plus its own time, a max-plus form, so the
model call's delay after the send is exactly max(C, f + D), with f the shared stage's end after the send:
C (the model's delay with the shared stage out of the way) is the first layout's, and D (the stages'
time from the shared stage's end to the model call) comes from the second. When the engine has run the
job, `release_ns` sends the model call; the final layout, with each job's wait and time in the step as
the stage's time, gives the same delays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from tokenpath.application.served import SHARED
from tokenpath.application.service import batch_ns, chip_forward, queues, request_tokens
from tokenpath.application.spec import ApplicationSpec, StageSpec
from tokenpath.application.stream import streaming
from tokenpath.application.timeline import Timeline, draw_latencies_ns, timeline
from tokenpath.compute.chip import ChipSpec
from tokenpath.config.assumptions import Assumptions
from tokenpath.config.errors import UserError
from tokenpath.sim.application import check_alone, question_tokens, upload_times_ns
from tokenpath.sim.scenario import Scenario
from tokenpath.workload import Requests

# Far beyond any stage's time (13 days in ns) and far inside int64: the shared stage's time in the two
# layouts that find C and D.
_FAR_NS = 1 << 50


class SharedStage:
    """The shared stage's jobs, one per request (rows in the order of the user's sends): when each is
    ready, their kernels' time on the deployment's chip, and when each model call is sent. It records
    when each job was done, for the final layout (`laid`)."""

    def __init__(self, spec: ApplicationSpec, stage: StageSpec, send_ns: np.ndarray, question_tokens: np.ndarray,
                 latency_ns: dict[str, np.ndarray], chip: ChipSpec, assumptions: Assumptions,
                 upload_ns: np.ndarray | None = None) -> None:
        """`upload_ns`: each request's way to the server (its model call's upload, which the engine adds as
        the call reaches it): the stages, this one's jobs on the GPU among them, run from there."""
        self.spec, self.name, self.send_ns, self.latency_ns = spec, stage.name, send_ns, latency_ns
        n = len(send_ns)
        self.upload_ns = np.zeros(n, np.int64) if upload_ns is None else upload_ns
        away = self._laid(np.full(n, -_FAR_NS, np.int64))
        self.begin_ns = away.start_ns[stage.name]
        self.without_ns = away.pre_ns  # C
        self.after_ns = self._laid(np.full(n, _FAR_NS, np.int64)).pre_ns - _FAR_NS - self.begin_ns  # D
        self.ready_ns = send_ns + self.upload_ns + self.begin_ns
        self.done_ns = np.full(n, -1, np.int64)
        self._kernel = batch_ns(chip_forward(stage, chip, assumptions), request_tokens(stage, question_tokens),
                                stage.served.batch)

    def kernel_ns(self, rows: list[int]) -> int:
        return self._kernel(np.asarray(rows, np.int64))

    def release_ns(self, row: int, done_ns: int) -> int:
        """Request `row`'s job was done at `done_ns`: when its model call is sent (its stages' time after the
        send, counted from its arrival at the server; the engine adds the way there)."""
        self.done_ns[row] = done_ns
        send, reached = int(self.send_ns[row]), int(self.send_ns[row] + self.upload_ns[row])
        return send + max(int(self.without_ns[row]), done_ns - reached + int(self.after_ns[row]))

    def rows(self, rows: np.ndarray) -> _Rows:
        """The jobs of `rows` (a replica's requests), numbered as that replica numbers them."""
        return _Rows(self, rows)

    def laid(self) -> Timeline:
        """The stages laid out with each job's time from its ready time to its end (its wait for a step
        and that step); after the run."""
        if (self.done_ns < 0).any():
            raise ValueError("the engine has not run every job of the shared stage")
        return streaming(self.spec, self.latency_ns, self._laid(self.done_ns - self.ready_ns))

    def _laid(self, shared_ns: np.ndarray) -> Timeline:
        return timeline(self.spec, {**self.latency_ns, self.name: shared_ns}, len(self.send_ns))


class _Rows:
    """A replica's share of the jobs, by its own row numbers."""

    def __init__(self, stage: SharedStage, rows: np.ndarray) -> None:
        self.stage, self.global_rows = stage, rows
        self.ready_ns = stage.ready_ns[rows]

    def kernel_ns(self, rows: list[int]) -> int:
        return self.stage.kernel_ns(self.global_rows[rows].tolist())

    def release_ns(self, row: int, done_ns: int) -> int:
        return self.stage.release_ns(int(self.global_rows[row]), done_ns)


def shared_stage(spec: ApplicationSpec) -> StageSpec | None:
    """The stage on the deployment's GPU, if one is."""
    return next((s for s in spec.stages if s.served is not None and s.served.on == SHARED), None)


def shared_calls(spec: ApplicationSpec, requests: Requests, rng: np.random.Generator, scenario: Scenario,
                 chip: ChipSpec, assumptions: Assumptions,
                 upload_ns: Callable[[int], int] | None = None) -> tuple[Requests, SharedStage]:
    """The requests as the engine gets them, in the order of the user's sends (each sent when its job is
    done), their prompts grown by the model stage's; and the shared stage's jobs. The stages' times are
    drawn as model_calls draws them (one seed, one result); those on queues of their own are timed here,
    each served stage on the user's question (`question_tokens`)."""
    check_alone(requests)
    _check(scenario)
    stage = shared_stage(spec)
    n = len(requests)
    send_ns = np.rint(requests.arrival_s * 1e9).astype(np.int64)
    latency_ns = draw_latencies_ns(spec, n, rng)
    question = question_tokens(requests, scenario.workload)
    prompt = spec.model.prompt
    added = 0 if prompt is None else prompt.added_tokens
    upload = upload_times_ns(upload_ns, requests.input_tokens + added)  # (the stages run from the server)
    latency_ns.update(_queue_times(spec, queues(spec, send_ns + upload, question, assumptions), latency_ns,
                                   stage.name, n))
    jobs = SharedStage(spec, stage, send_ns, question, latency_ns, chip, assumptions, upload)
    return Requests(requests.arrival_s, requests.input_tokens + added, requests.output_tokens, requests.prefixes,
                    None, requests.template_tokens), jobs


def _queue_times(spec: ApplicationSpec, served: Mapping[str, Callable[[np.ndarray], np.ndarray]],
                 latency_ns: dict[str, np.ndarray], shared: str, n: int) -> dict[str, np.ndarray]:
    """The times of the stages on queues of their own, by one layout: none waits for the shared stage
    (spec.py), so any time of that one lays them out where they run."""
    took: dict[str, np.ndarray] = {}

    def recorded(name: str, run: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        def record(begin: np.ndarray) -> np.ndarray:
            took[name] = run(begin)
            return took[name]
        return record

    timeline(spec, {**latency_ns, shared: np.zeros(n, np.int64)}, n,
             {name: recorded(name, run) for name, run in served.items()})
    return took


def _check(scenario: Scenario) -> None:
    dep, what = scenario.deployment, "application: a stage on the shared GPU (served.on = \"shared\")"
    if dep.prefill_replicas:
        raise UserError(f"{what} with disaggregated prefill is not modelled; set deployment.prefill_replicas = 0 "
                        "or serve the stage on \"cpu\" or a chip")
    if dep.pp > 1:
        raise UserError(f"{what} with pipeline parallelism is not modelled; set deployment.pp = 1 or serve the "
                        "stage on \"cpu\" or a chip")
    if scenario.workload.max_concurrency is not None:
        raise UserError(f"{what} with workload.max_concurrency is not modelled; remove max_concurrency or serve "
                        "the stage on \"cpu\" or a chip")
    if scenario.application.model.loop is not None:
        raise UserError(f"{what} with an agent loop is not modelled; remove the model stage's loop or serve the "
                        "stage on \"cpu\" or a chip")
