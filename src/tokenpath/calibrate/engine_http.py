"""What an engine's HTTP server costs its process per request and per streamed event: FastAPI under
uvicorn as vLLM and SGLang run it (calibrate/engine_http_app.py), the server process's CPU only.

`tokenpath calibrate delivery` adds it as the file's `[engine_http]`, beside `[http]` (the same two
figures on `tokenpath serve`'s own aiohttp stack, serve/measure.py). The server runs in a process of
its own on 127.0.0.1; this process is its client (bench/burst.py), and what is counted is the server's
CPU time, read from /proc (calibrate/proc_cpu.py) before and after each run, less what it spends idle
over the run's wall time (uvicorn's own timer ticks), measured once before.

- per request: a burst of `requests` streaming chat requests at once (a busy server, the regime where
  its cost matters, takes requests back to back), each on its own connection and answered with the
  response's head, `data: [DONE]` and its end, the connection closed: uvicorn's HTTP parsing and
  access log, Starlette's routing and middlewares, FastAPI's dependencies and its parsing of the body
  into the engine's pydantic request (the validation, as the engine does it), vLLM's cancellation
  tasks, the StreamingResponse. The same requests on the route that reads the body without parsing it
  give the HTTP layer alone (recorded);
- per event: `streams` streams sent `per_stream` chunks each, one per stream per step, less the same
  streams sent none, over the events: each chunk put in its collector, its stream's task woken, through
  both async generators and the StreamingResponse to uvicorn's write on the socket.

Each is the median of `repeats` runs, after one run of each kind that is not counted.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tokenpath
from tokenpath.bench.burst import post_request, send_burst
from tokenpath.calibrate.proc_cpu import cpu_s
from tokenpath.delivery.calibration import HttpCost

REQUESTS = 200
STREAMS, EVENTS_PER_STREAM = 32, 512
REQUIRED = ("fastapi", "uvicorn")
INSTALL = "pip install 'tokenpath[engines]'"
# The app's routes (calibrate/engine_http_app.py, not imported here: it needs fastapi).
CHAT_PATH, RAW_PATH, PLAN_PATH = "/v1/chat/completions", "/v1/raw/chat/completions", "/_plan"
START_S = 60.0      # a loaded machine may take a while to import fastapi and uvicorn
IDLE_S = 0.3        # the idle baseline's wall time
# A run has ended in the server once its CPU time grows by no more than SETTLE_SLACK_S over SETTLE_S
# (connections closed after the client has read every response): a timer tick's work, not a request's.
SETTLE_S, SETTLE_SLACK_S, SETTLE_MAX_S = 0.02, 50e-6, 2.0


def missing() -> str | None:
    """Why the measurement cannot run here (fastapi or uvicorn not installed), or None."""
    absent = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    return f"{' and '.join(absent)} not installed ({INSTALL})" if absent else None


def versions() -> dict[str, str]:
    found = {}
    for name in ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


class EngineServer:
    """The engine's HTTP server in a child process on 127.0.0.1, its socket bound here first (as vLLM
    binds it before its server starts) and handed over."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.log = tempfile.TemporaryFile()
        source = str(Path(tokenpath.__file__).resolve().parent.parent)  # this tokenpath, wherever it is
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tokenpath.calibrate.engine_http_app", str(self.sock.fileno())],
            pass_fds=(self.sock.fileno(),), stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        self.pid = self.process.pid
        try:
            self.info = self._wait_started()
        except BaseException:
            self.close()
            raise

    def _wait_started(self) -> dict[str, Any]:
        deadline = time.monotonic() + START_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the engine HTTP server exited with status {self.process.returncode}: "
                                   f"{self._log_tail()}")
            try:
                return self.plan(0, 0)
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the engine HTTP server did not answer within {START_S:g} s") from None
                time.sleep(0.05)

    def _log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:].strip()

    def plan(self, streams: int, events: int) -> dict[str, Any]:
        """Set the next run's streams and steps; the server's answer (its pid, loop and HTTP protocol)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as conn:
            conn.sendall(post_request(self.port, PLAN_PATH, json.dumps({"streams": streams, "events": events}).encode(),
                                      {"Connection": "close"}))
            answer = b""
            while data := conn.recv(1 << 16):
                answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise OSError(f"plan refused: {head[:80]!r}")
        return json.loads(body)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.sock.close()
        self.log.close()

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def settled_cpu_s(pid: int, read: Callable[[int], float] = cpu_s) -> float:
    """The server's CPU seconds once it has stopped working (see SETTLE_S)."""
    deadline = time.monotonic() + SETTLE_MAX_S
    before = read(pid)
    while True:
        time.sleep(SETTLE_S)
        after = read(pid)
        if after - before <= SETTLE_SLACK_S or time.monotonic() > deadline:
            return after
        before = after


def net_cpu_s(before_s: float, after_s: float, wall_s: float, idle_per_s: float) -> float:
    """A run's CPU seconds in the server: its CPU time's growth less what it spends idle over the wall time."""
    return after_s - before_s - idle_per_s * wall_s


def _run_s(server: EngineServer, path: str, body: bytes, streams: int, events: int, idle_per_s: float,
           read: Callable[[int], float]) -> float:
    """Server CPU seconds of `streams` requests sent at once to `path`, each streamed `events` chunks."""
    server.plan(streams, events)
    request = post_request(server.port, path, body)
    before_s, start = settled_cpu_s(server.pid, read), time.monotonic()
    send_burst(server.port, streams, request)
    after_s = settled_cpu_s(server.pid, read)
    return net_cpu_s(before_s, after_s, time.monotonic() - start, idle_per_s)


def _idle_per_s(server: EngineServer, read: Callable[[int], float]) -> float:
    before_s, start = read(server.pid), time.monotonic()
    time.sleep(IDLE_S)
    return max(0.0, (read(server.pid) - before_s) / (time.monotonic() - start))


def measure_engine_http(body: bytes, repeats: int = 3, requests: int = REQUESTS, streams: int = STREAMS,
                        per_stream: int = EVENTS_PER_STREAM,
                        read: Callable[[int], float] = cpu_s) -> tuple[HttpCost, dict[str, Any]]:
    """The engine HTTP server's cost per request (its body validated) and per streamed event, medians of
    `repeats` runs each, and how they were measured (for the file's [path]). Needs fastapi and uvicorn
    (`missing`)."""
    per_request, unparsed, per_event = [], [], []
    with EngineServer() as server:
        for k in range(repeats + 1):  # the first round warms the server up and is not counted
            idle_per_s = _idle_per_s(server, read)
            chat_s = _run_s(server, CHAT_PATH, body, requests, 0, idle_per_s, read) / requests
            raw_s = _run_s(server, RAW_PATH, body, requests, 0, idle_per_s, read) / requests
            streamed_s = _run_s(server, CHAT_PATH, body, streams, per_stream, idle_per_s, read)
            opened_s = _run_s(server, CHAT_PATH, body, streams, 0, idle_per_s, read)
            if k:
                per_request.append(chat_s)
                unparsed.append(raw_s)
                per_event.append((streamed_s - opened_s) / (streams * per_stream))
        info = server.info
    request_s, unparsed_s = (max(0.0, statistics.median(runs)) for runs in (per_request, unparsed))
    cost = HttpCost(request_s, max(0.0, statistics.median(per_event)))
    how = {"stack": f"FastAPI under uvicorn as vLLM and SGLang launch it, in a process of its own on 127.0.0.1: "
                    f"event loop {info['loop']}, HTTP protocol {info['http']}, CORSMiddleware, access log on; "
                    "the server process's CPU time from /proc, less its idle rate; the client in this process",
           "versions": versions(), "server_pid": server.pid,
           "request": f"a burst of {requests} streaming chat requests of {len(body)} body bytes at once, each on "
                      "its own connection, parsed by FastAPI into the engine's pydantic ChatCompletionRequest behind "
                      "vLLM's validate_json_request and with_cancellation, answered with the head, data: [DONE] and "
                      "the end, the connection closed",
           "event": f"{streams} streams x {per_stream} pre-built chat chunks, one per stream per step, less the same "
                    "streams with none: collector, async generators, StreamingResponse, uvicorn's write",
           "request_s_runs": per_request, "event_s_runs": per_event,
           "unparsed_request_s": unparsed_s, "fastapi_parse_s": max(0.0, request_s - unparsed_s),
           "unparsed": "unparsed_request_s: the same route reading the body without parsing it (the HTTP layer "
                       "alone); fastapi_parse_s: the difference, FastAPI's JSON decoding and the pydantic request",
           "repeats": repeats, "statistic": "median"}
    return cost, how
