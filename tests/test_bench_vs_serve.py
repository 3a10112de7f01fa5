"""bench against serve over real HTTP on loopback: the measured run matches the simulated one.

serve runs the scenario's engine in real time, so bench should measure what simulate predicts for the
same requests. What separates them is real and small: loopback HTTP, two event loops on a shared
2-core machine, and the emulator's own per-step Python work, each adding up to a few milliseconds.
The tolerances below are set from that, not from the values measured.
"""

import asyncio
import threading

import pytest
from aiohttp import web

from tokenpath.bench import Target, run_bench
from tokenpath.pipeline import simulate
from tokenpath.report.simulation import result_document
from tokenpath.scenario import load_scenario
from tokenpath.serve import make_app
from tokenpath.serve.app import RUN_OPTIONS

SCENARIO = {
    "deployment.chip": "h100", "deployment.chips": 4, "deployment.tp": 4, "model.name": "llama-3.1-70b",
    "workload.num_requests": 30, "workload.arrival.rate": 4.0,
    "workload.input": {"kind": "normal", "mean": 300, "sd": 50},
    "workload.output": {"kind": "fixed", "value": 40},
    # loopback: no simulated network in the way
    "delivery.network_rtt": 0, "delivery.network_bw": "10 GB/s",
}


class LoopbackServer:
    """tokenpath serve on a free 127.0.0.1 port, in a thread of its own."""

    def __init__(self, scenario):
        self.app = make_app(scenario)
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.app, **RUN_OPTIONS)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(60)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def test_bench_measures_what_simulate_predicts_for_the_same_requests(tmp_path):
    scenario = load_scenario("typical", SCENARIO)
    predicted = result_document(simulate(scenario))[0]
    with LoopbackServer(scenario) as url:
        measured = run_bench(scenario, Target(url, "m"), str(tmp_path / "results.jsonl"), workers=1).summary

    assert measured["requests"]["completed"] == 30 and measured["requests"]["failed"] == 0
    assert measured["requests"]["output_tokens_mean"] == predicted["requests"]["output_tokens_mean"] == 40
    p, m = predicted["latency_s"], measured["latency_s"]
    # TTFT: at most a few ms of HTTP and scheduling on top, never less than the engine's prefill
    assert p["ttft"]["p50"] - 0.002 <= m["ttft"]["p50"] <= p["ttft"]["p50"] + 0.015
    # TPOT and E2E: the same step times (the emulator's own lateness delays delivery, not the engine)
    assert m["tpot"]["mean"] == pytest.approx(p["tpot"]["mean"], rel=0.1)
    assert m["e2e"]["mean"] == pytest.approx(p["e2e"]["mean"], rel=0.05, abs=0.015)
    # throughput: set by the arrivals in both, over nearly the same window
    rate = measured["throughput"]["output_tokens_per_s"]
    assert rate == pytest.approx(predicted["throughput"]["output_tokens_per_s"], rel=0.1)
