"""An engine's HTTP layer measured from outside its process (calibrate/engine_http.py): the CPU-time
arithmetic on /proc, and the measurement end to end on loopback where fastapi and uvicorn are installed."""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_helpers import dechunk
from tokenpath.calibrate import engine_http, proc_cpu
from tokenpath.delivery.request_measure import request_body

BODY = request_body([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])


def stat_line(pid: int, comm: str, utime: int, stime: int) -> str:
    """A /proc/PID/stat line: utime and stime are fields 14 and 15, the rest made up."""
    return f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 3120 0 0 0 {utime} {stime} 0 0 20 0 1 0 1807 3133440 412\n"


def test_a_process_s_cpu_time_is_the_sum_of_its_threads_schedstat(tmp_path):
    for tid, line in ((41, "1500000000 2000 12\n"), (42, "250000123 7 3\n")):
        (tmp_path / "41" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "41" / "task" / str(tid) / "schedstat").write_text(line)
    (tmp_path / "41" / "stat").write_text(stat_line(41, "python", 999, 999))  # not read: schedstat is finer
    assert proc_cpu.cpu_s(41, tmp_path) == 1.750000123


def test_without_schedstat_the_stat_line_s_ticks_count(tmp_path):
    (tmp_path / "7" / "task" / "7").mkdir(parents=True)  # a thread, but no schedstat on this kernel
    (tmp_path / "7" / "stat").write_text(stat_line(7, "uv (worker) 1", 250, 50))
    assert proc_cpu.cpu_s(7, tmp_path) == 300 / os.sysconf("SC_CLK_TCK")


@settings(max_examples=80, deadline=None)
@given(st.text(st.characters(blacklist_characters="\x00\n"), max_size=15), st.integers(0, 2**40),
       st.integers(0, 2**40))
def test_any_command_name_leaves_utime_and_stime_readable(comm, utime, stime):
    assert proc_cpu.stat_ticks(stat_line(123, comm, utime, stime)) == utime + stime


@given(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**31))
def test_schedstat_s_first_field_is_the_run_time(run_ns, wait_ns, slices):
    assert proc_cpu.schedstat_ns(f"{run_ns} {wait_ns} {slices}\n") == run_ns


def test_a_run_s_cpu_is_its_growth_less_the_idle_rate_over_its_wall_time():
    # 0.5 s of CPU over 2 s of wall time, of which 1% of a CPU is the idle server's own ticking.
    assert engine_http.net_cpu_s(10.0, 10.5, 2.0, 0.01) == pytest.approx(0.48, abs=1e-12)


def test_the_server_has_settled_once_its_cpu_stops_growing(monkeypatch):
    monkeypatch.setattr(engine_http, "SETTLE_S", 0.0)
    readings = iter([1.0, 1.2, 1.3, 1.30004, 9.9])  # still working, working, then 40 us: a tick, not work
    assert engine_http.settled_cpu_s(5, lambda pid: next(readings)) == 1.30004


@pytest.mark.skipif(engine_http.missing() is not None, reason="fastapi and uvicorn are not installed")
def test_the_measurement_runs_end_to_end_on_the_server_s_cpu(monkeypatch):
    monkeypatch.setattr(engine_http, "IDLE_S", 0.05)
    pids, streams = [], []
    real_send = engine_http.send_burst

    def read(pid: int) -> float:
        pids.append(pid)
        return proc_cpu.cpu_s(pid)

    def send(port: int, count: int, request: bytes) -> None:
        received: list[bytes] = []
        real_send(port, count, request, received)
        streams.extend(received)

    monkeypatch.setattr(engine_http, "send_burst", send)
    cost, how = engine_http.measure_engine_http(BODY, repeats=1, requests=8, streams=4, per_stream=128, read=read)
    assert cost.request_s > 0 and cost.event_s > 0
    assert set(pids) == {how["server_pid"]} and how["server_pid"] != os.getpid()  # the server's CPU, not ours
    assert "uvicorn" in how["stack"] and set(how["versions"]) >= {"fastapi", "uvicorn", "starlette"}
    # What each stream got: the head, then (in the event runs) 128 chunks, then [DONE] and the end.
    longest = max(streams, key=len)
    head, _, chunked = longest.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-type: text/event-stream" in head.lower()
    events = [e for e in dechunk(chunked).split(b"\n\n") if e]
    assert len(events) == 129 and events[-1] == b"data: [DONE]"
    texts = [orjson.loads(e[len(b"data: "):])["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert texts[:3] == [" the", " server", " streams"]

