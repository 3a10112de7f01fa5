"""bench against serve over real HTTP on loopback: the measured run matches the simulated one.

serve runs the scenario's engine in real time, so bench should measure what simulate predicts for the
same requests. What separates them is real and small: loopback HTTP, two event loops on a shared
2-core machine, and the emulator's own per-step Python work, each adding up to a few milliseconds.
Those milliseconds also move each request's arrival at the engine, and with it the step it joins:
while the engine is busy, a request waits for the step in flight, and serve's steps fall a few
milliseconds off simulate's, so a request can wait up to one decode step less (or more) than simulate
says. So TTFT's median is held to at most one decode step below simulate's and a few milliseconds of
HTTP above it. The tolerances below are set from that, not from the values measured.

Two ways: on loopback with no network in the scenario and serve's network emulation off, and on the
scenario's own network (20 ms round trip, 100 Mb/s), which serve emulates by delaying the request on
its way in and each event on its way out (serve/network.py). TTFT is compared as both sides define
it: from the send to the first event carrying a token reaching the client, taken for simulate from
its per-token client arrival times (so the comparison holds whether simulate's summary TTFT ends
at the engine or at the client).
"""

import numpy as np
import pytest

from serve_helpers import LoopbackServer
from tokenpath import load_scenario, simulate
from tokenpath.bench import Target, run_bench
from tokenpath.serve import ServeOptions
from tokenpath.sim.document import result_document

SCENARIO = {
    "deployment.chip": "h100", "deployment.chips": 4, "deployment.tp": 4, "model.name": "llama-3.1-70b",
    "workload.num_requests": 30, "workload.arrival.rate": 4.0,
    "workload.input": {"kind": "normal", "mean": 300, "sd": 50},
    "workload.output": {"kind": "fixed", "value": 40},
    # the shipped corpus is English prose: every token shows a character (delivery/spec.py)
    "delivery.invisible_token_fraction": 0,
}
# loopback: no simulated network in the way
LOOPBACK = {"delivery.network_rtt": 0, "delivery.network_bw": "10 GB/s"}
# the scenario's default network, emulated by serve
NETWORK = {"workload.num_requests": 20, "workload.arrival.rate": 6.0}


def first_token_at_client_s(run):
    """Per request: its send to the arrival of the first token at the client, from simulate's run."""
    offsets = np.concatenate([[0], np.cumsum(run.output_tokens)])
    return (run.token_client_ns[offsets[:-1]] - run.sent_ns) / 1e9


@pytest.mark.parametrize("network", ["loopback", "emulated"])
def test_bench_measures_what_simulate_predicts_for_the_same_requests(tmp_path, network):
    overrides = {**SCENARIO, **(LOOPBACK if network == "loopback" else NETWORK)}
    scenario = load_scenario("typical", overrides)
    simulation = simulate(scenario)
    predicted = result_document(simulation)[0]
    ttft_p50 = float(np.median(first_token_at_client_s(simulation.run)))
    with LoopbackServer(scenario, ServeOptions(network_delay=network == "emulated")) as url:
        measured = run_bench(scenario, Target(url, "m"), str(tmp_path / "results.jsonl"), workers=1).summary

    n = overrides["workload.num_requests"]
    assert measured["requests"]["completed"] == n and measured["requests"]["failed"] == 0
    assert measured["requests"]["output_tokens_mean"] == predicted["requests"]["output_tokens_mean"] == 40
    p, m = predicted["latency_s"], measured["latency_s"]
    if network == "emulated":  # the network is a large part of it: a 10 ms half round trip each way
        assert ttft_p50 - p["ttft"]["p50"] in (0, pytest.approx(0.010, abs=0.001))  # engine- or client-side TTFT
        assert m["ttft"]["p50"] > 0.020
    # TTFT and TTFV: at most a few ms of HTTP and scheduling on top; below, at most the wait for one
    # decode step in flight (simulate's mean time per output token), never the engine's prefill
    step_s = p["tpot"]["mean"]
    assert ttft_p50 - step_s <= m["ttft"]["p50"] <= ttft_p50 + 0.015
    assert p["ttfv"]["p50"] - step_s <= m["ttfv"]["p50"] <= p["ttfv"]["p50"] + 0.015
    # TPOT and E2E: the same step times (the emulator's own lateness delays delivery, not the engine)
    assert m["tpot"]["mean"] == pytest.approx(p["tpot"]["mean"], rel=0.1)
    assert m["e2e"]["mean"] == pytest.approx(p["e2e"]["mean"], rel=0.05, abs=0.015)
    # throughput: set by the arrivals in both, over nearly the same window
    rate = measured["throughput"]["output_tokens_per_s"]
    assert rate == pytest.approx(predicted["throughput"]["output_tokens_per_s"], rel=0.1)
