"""The client's own CPU and event loop lag over a bench run (bench/client.py): the saturation rule on
hand-built measurements, the meter on a loop the test blocks itself, and a real run against serve."""

from __future__ import annotations

import asyncio
import json
import time

import orjson
import pytest

from cli_helpers import assert_user_error, run_cli
from serve_helpers import LoopbackServer
from test_bench import _row
from tokenpath import load_scenario
from tokenpath.bench import Target, run_bench
from tokenpath.bench.client import (
    LAG_FLOOR_S,
    ClientMeter,
    client_block,
    client_line,
    lag_threshold_s,
    saturation_warning,
)
from tokenpath.bench.runner import new_loop

# Medians of a typical run: TTFT 200 ms, ITL 20 ms.
LATENCY = {"ttft": {"p50": 0.2}, "itl": {"p50": 0.02}}


def measured(busy: float, lags_ms: list[float], worker: int = 0, wall_s: float = 10.0,
             wait: float | None = None) -> dict:
    return client_line({"cpu_s": busy * wall_s, "wall_s": wall_s, "cpu_wait_s": None if wait is None else wait * wall_s,
                        "lag_us": [round(ms * 1000) for ms in lags_ms]}, worker)


def test_the_lag_threshold_follows_how_arrivals_are_stamped():
    # event-loop stamps: a tenth of the shorter median (ITL's 20 ms); kernel stamps: the smaller of a tenth
    # of the median TTFT (20 ms) and half the median ITL (10 ms), where a stream's events start to share a read
    assert lag_threshold_s(LATENCY, "event loop") == pytest.approx(0.002)
    assert lag_threshold_s(LATENCY, "kernel") == pytest.approx(0.010)
    assert lag_threshold_s({"ttft": {"p50": 0.5}, "itl": {"p50": 0.1}}, "event loop") == pytest.approx(0.010)
    # never below an idle loop's own lateness; unknown medians (every request failed) leave the floor
    assert lag_threshold_s({"ttft": {"p50": 0.01}, "itl": {"p50": 0.005}}, "event loop") == LAG_FLOOR_S
    assert lag_threshold_s({"ttft": {"p50": None}, "itl": {"p50": None}}, "kernel") == LAG_FLOOR_S


def test_a_busy_cpu_is_saturated():
    block = client_block([measured(0.95, [0.3] * 100)], LATENCY, "kernel")
    assert block["saturated"] is True and block["cpu_busy_fraction"] == pytest.approx(0.95)
    assert block["reason"] == "its CPU was busy 95% of the run"
    assert block["loop_lag_s"] == {"p50": 0.0003, "p99": 0.0003, "max": 0.0003} and block["workers"] == 1


def test_a_light_cpu_with_small_lag_is_not():
    block = client_block([measured(0.3, [0.2] * 50 + [1.0] * 50)], LATENCY, "event loop")
    assert block["saturated"] is False and block["cpu_busy_fraction"] == pytest.approx(0.3)
    assert block["loop_lag_s"] == {"p50": pytest.approx(0.0006), "p99": 0.001, "max": 0.001}
    assert block["reason"] == ("its CPU was busy 30% of the run and its event loop woke up to 1 ms late (p99), "
                               "under the 90% and 2 ms that would distort the latencies")
    assert saturation_warning(block, overloaded=True) is None


def test_a_late_loop_is_saturated_where_the_lag_would_move_the_stamps():
    lags = [0.5] * 95 + [8.0] * 5  # 5% of wake-ups 8 ms late
    late = client_block([measured(0.3, lags)], LATENCY, "event loop")
    assert late["saturated"] is True and late["loop_lag_s"]["p99"] == pytest.approx(0.008)
    assert late["reason"] == "its event loop woke up to 8 ms late (p99), over the 2 ms that shows in the latencies"
    # kernel stamps keep each arrival's time until the lag nears a stream's gap between events (10 ms here)
    assert client_block([measured(0.3, lags)], LATENCY, "kernel")["saturated"] is False
    assert client_block([measured(0.3, [0.5] * 95 + [15.0] * 5)], LATENCY, "kernel")["saturated"] is True


def test_a_few_late_wakeups_of_a_short_run_are_not_saturation():
    # 50 wake-ups: p99 is among the two largest, and two late ones can be the operating system's doing
    assert client_block([measured(0.2, [0.3] * 48 + [9.0] * 2)], LATENCY, "event loop")["saturated"] is False
    assert client_block([measured(0.2, [0.3] * 47 + [9.0] * 3)], LATENCY, "event loop")["saturated"] is True


def test_the_worst_worker_speaks_for_the_client():
    block = client_block([measured(0.4, [0.3] * 100, worker=0), measured(0.96, [0.3] * 99 + [4.0], worker=1)],
                         LATENCY, "kernel")
    assert block["cpu_busy_fraction"] == pytest.approx(0.96) and block["loop_lag_s"]["max"] == 0.004
    assert block["reason"] == "its CPU was busy 96% of the run (worker 2 of 2)" and block["workers"] == 2
    assert client_block([], LATENCY, "kernel") is None  # no worker's measurement: nothing to judge


def test_the_warning_says_what_to_do_and_spares_the_server():
    block = client_block([measured(0.97, [0.5] * 90 + [23.0] * 10)], LATENCY, "event loop")
    line = saturation_warning(block, overloaded=False)
    assert line.startswith("client saturated: its CPU was busy 97% of the run and its event loop woke up to "
                           "23 ms late (p99)")
    assert "latencies include the client's own delay" in line and "--workers" in line and "overload" not in line
    assert saturation_warning(block, overloaded=True).endswith(
        "the run's signs of overload may be the client's, not the server's")


def test_a_loop_late_for_want_of_a_cpu_is_told_to_get_one():
    """Late wake-ups while the client used little CPU and waited long for one: other processes held it."""
    block = client_block([measured(0.05, [0.5] * 90 + [6.0] * 10, wait=0.3)], LATENCY, "event loop")
    assert block["saturated"] is True and block["cpu_wait_fraction"] == pytest.approx(0.3)
    assert block["reason"] == ("its event loop woke up to 6 ms late (p99), over the 2 ms that shows in the latencies, "
                               "while its CPU was busy 5% of the run and it waited 30% of the run for a CPU that "
                               "other processes held")
    assert "run the client on CPUs that no other work shares" in saturation_warning(block, overloaded=False)
    busy = client_block([measured(0.95, [0.5] * 90 + [6.0] * 10, wait=0.02)], LATENCY, "event loop")
    assert "fewer concurrent requests per client process" in saturation_warning(busy, overloaded=False)


@pytest.mark.parametrize("loop_kind", ["default loop", "bench's loop"])
def test_the_meter_sees_a_loop_blocked_by_the_test(loop_kind):
    """Three 50 ms blocks of the loop: each makes a 10 ms sleeper wake at least 40 ms late, whatever the
    machine's speed (it went to sleep before the block began, and cannot run until it ends)."""
    async def blocked() -> dict:
        meter = ClientMeter(period_s=0.010)
        meter.start()
        await asyncio.sleep(0.03)
        for _ in range(3):
            time.sleep(0.05)  # the loop can do nothing else meanwhile
            await asyncio.sleep(0.03)
        # CPU work the meter must count: spin until this process has used 0.1 s of CPU
        spin_until_ns = time.process_time_ns() + 100_000_000
        while time.process_time_ns() < spin_until_ns:
            pass
        return meter.stop()

    loop = asyncio.new_event_loop() if loop_kind == "default loop" else new_loop()
    try:
        reading = loop.run_until_complete(blocked())
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    lags_us = reading["lag_us"]
    assert max(lags_us) >= 40_000 and sum(lag >= 40_000 for lag in lags_us) >= 3
    assert reading["cpu_s"] >= 0.1 and reading["wall_s"] >= 0.15  # the spin's CPU; the three blocks at least
    assert reading["cpu_wait_s"] is None or 0 <= reading["cpu_wait_s"] <= reading["wall_s"]
    block = client_block([client_line(reading, 0)], LATENCY, "event loop")
    assert block["saturated"] is True and block["loop_lag_s"]["max"] >= 0.04
    assert "its event loop woke up to" in block["reason"]


def test_a_real_run_reports_its_client(tmp_path):
    """bench against `tokenpath serve` on loopback, two worker processes: each writes its measurement,
    and the summary judges them. Whether this shared machine saturated is not asserted."""
    scenario = load_scenario("typical", {
        "deployment.chip": "h100", "deployment.chips": 4, "deployment.tp": 4, "model.name": "llama-3.1-70b",
        "workload.num_requests": 8, "workload.arrival.rate": 20.0, "workload.input": {"kind": "fixed", "value": 50},
        "workload.output": {"kind": "fixed", "value": 20}, "delivery.network_rtt": 0,
    })
    path = tmp_path / "results.jsonl"
    with LoopbackServer(scenario) as url:
        result = run_bench(scenario, Target(url, "m"), str(path), workers=2)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    workers = sorted(line["worker"] for line in lines if "client" in line)
    assert workers == [0, 1] and result.summary["requests"]["completed"] == 8
    assert [line["worker"] for line in result.header["client"]] in ([0, 1], [1, 0])
    client = result.summary["bench"]["client"]
    assert 0.0 <= client["cpu_busy_fraction"] <= 1.0 and client["workers"] == 2
    lag = client["loop_lag_s"]
    assert 0.0 <= lag["p50"] <= lag["p99"] <= lag["max"]
    assert client["lag_threshold_s"] >= LAG_FLOOR_S
    # saturated or not (this shared machine decides), the reason says which measurement it rests on
    if client["saturated"]:
        assert client["reason"].startswith(("its CPU was busy", "its event loop woke up")), client["reason"]
    else:
        assert client["reason"].startswith("its CPU was busy") and " under the " in client["reason"], client["reason"]


def test_report_warns_of_a_saturated_client(tmp_path, monkeypatch, capsys):
    """A results file whose worker measured itself busy 97% of its run: `report` says so, with --json - too."""
    header = {"schema": "tokenpath.bench/1", "scenario": {"name": "s", "fingerprint": "f"}, "slo": {}, "planned": 2,
              "workers": 1, "timestamps": "kernel"}
    documents = [header, _row(0), _row(1, sent=100), measured(0.97, [0.5] * 100)]
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in documents))
    code, out, err = run_cli(["report", str(path), "--json", "-"], monkeypatch, capsys)
    assert code == 0 and json.loads(out)["bench"]["client"]["saturated"] is True
    assert err.startswith("warning: client saturated: its CPU was busy 97% of the run; latencies include")
    code, out, err = run_cli(["report", str(path)], monkeypatch, capsys)
    assert code == 0 and "TTFT" in out and "client saturated" in err
    # a damaged measurement is a one-line error naming its line, as a damaged request is
    documents[3]["client"]["lag_us"] = [1, -5]
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in documents))
    assert_user_error(*run_cli(["report", str(path)], monkeypatch, capsys),
                      f"{path}:4: client: 'lag_us' must be a list of microseconds >= 0")
