"""serve's connections: read timeouts, the connection cap, and accept() out of file descriptors.

Clients here are raw loopback sockets that misbehave on purpose (trickle a request head, send half a
body, idle); every one stops by itself within a bounded time.
"""

import asyncio
import json
import logging
import os
import subprocess
import sys
import time

import aiohttp

from serve_helpers import LoopbackServer
from tokenpath import load_scenario
from tokenpath.serve import ServeOptions
from tokenpath.serve.connections import ConnectionLimits

FAST = {"model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1, "delivery.network_rtt": 0}
HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "   # never finished: no blank line follows


def serving(**limits):
    return LoopbackServer(load_scenario("typical", FAST), ServeOptions(limits=ConnectionLimits(**limits)))


async def health_latency_s(url):
    """GET /health on a fresh connection, timed from the client: connect, send, whole answer."""
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=10)) as response:
            assert response.status == 200 and await response.text() == "ok"
    return time.perf_counter() - start


async def read_until_closed(reader, bound_s):
    """Everything the server sends until it closes the connection; None if it has not closed it
    within `bound_s` (so a test never hangs)."""
    received = b""
    try:
        async with asyncio.timeout(bound_s):
            while piece := await reader.read(65536):
                received += piece
    except ConnectionResetError:
        pass
    except TimeoutError:
        return None
    return received


def test_300_connections_trickling_a_head_do_not_delay_health_and_are_closed_after_the_header_timeout():
    header_timeout_s, trickle_s = 2.0, 0.1

    async def main(url, port):
        connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(300)]

        async def trickle(reader, writer):
            writer.write(HEAD)
            closed = asyncio.ensure_future(read_until_closed(reader, 4 * header_timeout_s))
            while not closed.done():  # one more header byte every 0.1 s until the server closes
                try:
                    writer.write(b"a")
                    await writer.drain()
                except ConnectionError:
                    pass
                await asyncio.wait([closed], timeout=trickle_s)
            writer.close()
            return closed.result()

        trickles = [asyncio.ensure_future(trickle(r, w)) for r, w in connections]
        await asyncio.sleep(0.2)
        latencies, held = [], []
        for _ in range(3):
            latencies.append(await health_latency_s(url))
            held.append(sum(not t.done() for t in trickles))
            await asyncio.sleep(0.1)
        return latencies, held, await asyncio.gather(*trickles)

    with serving(header_timeout_s=header_timeout_s) as url:
        latencies, held, answers = asyncio.run(main(url, int(url.rsplit(":", 1)[1])))

    # /health answers at once while the 300 are held open, trickling (the bound: 1 s)
    assert held[0] == 300
    assert max(latencies) < 1.0, latencies
    # then each is closed, with a 408 saying why
    assert len(answers) == 300 and None not in answers
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 Request Timeout")
        assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_full_server_makes_room_by_closing_the_longest_waiting_connection_and_refuses_only_when_all_are_busy(caplog):
    caplog.set_level(logging.WARNING, logger="tokenpath.serve")

    async def main(url, port):
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.1)
        # full of connections that sent nothing: a fourth gets in, the oldest is closed for it
        await health_latency_s(url)
        first_closed = await read_until_closed(idle[0][0], 5)
        still_open = [not reader.at_eof() for reader, _ in idle[1:]]
        # three streams in progress fill it (closing the other two idle ones): a fourth is refused
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            request = {"model": "m", "prompt": "Once", "max_tokens": 2000, "stream": True}
            streams = [await session.post(f"{url}/v1/completions", json=request) for _ in range(3)]
            for stream in streams:
                await stream.content.readuntil(b"\n\n")  # in progress
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            refused = await read_until_closed(reader, 5)
            writer.close()
            for stream in streams:
                stream.close()
        return first_closed, still_open, refused

    with serving(max_connections=3, header_timeout_s=30) as url:
        first_closed, still_open, refused = asyncio.run(main(url, int(url.rsplit(":", 1)[1])))

    assert first_closed == b"" and still_open == [True, True]
    assert refused is not None
    head, _, body = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert json.loads(body)["error"]["type"] == "server_error"
    # three connections closed to make room, one refused: each kind logged once in its interval
    lines = [r.getMessage() for r in caplog.records if r.name == "tokenpath.serve"]
    assert sum("to make room" in line for line in lines) == 1
    assert sum("refused a connection with a 503" in line for line in lines) == 1


def test_a_body_that_does_not_arrive_in_time_gets_a_408_and_an_idle_connection_is_closed():
    async def main(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\": ")   # 10 of the 100 bytes
        slow_body = await read_until_closed(reader, 10)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")   # keep-alive, then nothing
        idle = await read_until_closed(reader, 10)
        writer.close()
        return slow_body, idle

    with serving(body_timeout_s=0.3, idle_timeout_s=0.3) as url:
        slow_body, idle = asyncio.run(main(int(url.rsplit(":", 1)[1])))

    assert slow_body is not None and idle is not None
    head, _, body = slow_body.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert "--body-timeout" in json.loads(body)["error"]["message"]
    # the /health answer came, then the server closed the idle connection (read_until_closed returned)
    assert idle.startswith(b"HTTP/1.1 200 OK") and idle.endswith(b"ok")


def test_a_declared_body_over_the_limit_is_a_413_and_a_client_leaving_mid_body_logs_no_traceback(caplog):
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "

    async def main(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + b"99999999999999\r\n\r\n{}")   # 2 of the bytes it declares
        answer = await asyncio.wait_for(reader.readuntil(b"}}"), 10)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + b"100\r\n\r\n{}")   # 2 of 100 bytes, then gone
        await writer.drain()
        writer.close()
        await asyncio.sleep(0.5)
        return answer, await health_latency_s(f"http://127.0.0.1:{port}")

    with serving() as url:
        answer, health_s = asyncio.run(main(int(url.rsplit(":", 1)[1])))
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413")
    assert json.loads(body)["error"]["message"] == "the request body is larger than 4194304 bytes"
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert health_s < 5


SERVER_WITH_FEW_FILES = """
import asyncio, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from tokenpath.sim.scenario import load_scenario
from tokenpath.serve import ServeOptions, make_app
from tokenpath.serve.app import start_server, stop_server
from tokenpath.serve.connections import ConnectionLimits

async def main():
    options = ServeOptions(limits=ConnectionLimits(header_timeout_s=30, max_connections=1000))
    app = make_app(load_scenario("typical", {fast}), options)
    runner, listener = await start_server(app, "127.0.0.1", 0)
    print(listener.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    await stop_server(runner, listener)

asyncio.run(main())
"""


def test_out_of_file_descriptors_the_server_still_answers_and_logs_once_per_interval():
    # A cap above the process's open-file limit (100): accept() fails with EMFILE, and asyncio's own
    # accept loop would then log a traceback per attempt and leave /health unanswered.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen([sys.executable, "-c", SERVER_WITH_FEW_FILES.replace("{fast}", repr(FAST))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        port = int(server.stdout.readline())

        async def main():
            connections = []
            for _ in range(150):  # more than the server has descriptors for
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(HEAD)
                connections.append(writer)
            await asyncio.sleep(0.3)
            latency_s = await health_latency_s(f"http://127.0.0.1:{port}")
            for writer in connections:
                writer.close()
            return latency_s

        latency_s = asyncio.run(main())
    finally:
        _, err = server.communicate(b"", timeout=60)
    lines = err.decode().splitlines()
    assert latency_s < 10  # answered (its connection made room), not timed out
    assert "Traceback" not in err.decode()
    assert 1 <= sum("accept() failed: Too many open files" in line for line in lines) <= 2, lines[:5]
    assert server.returncode == 0


def test_a_malformed_request_is_answered_400_and_logged_in_one_line(caplog):
    """aiohttp answers what its parser refuses with a 400 and logs a traceback (a bad method: nothing);
    serve logs one line per such request, naming the client and what was wrong."""
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    caplog.set_level(logging.WARNING, logger="tokenpath.serve")
    bad = [b"GARBAGE\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"]

    async def main(port):
        answers = []
        for request in bad:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            answers.append(await read_until_closed(reader, 5))
            writer.close()
        return answers

    with serving() as url:
        answers = asyncio.run(main(int(url.rsplit(":", 1)[1])))
    assert all(answer.startswith(b"HTTP/1.0 400 Bad Request") for answer in answers)
    assert b"Invalid method" in answers[0] and b"Content-Length" in answers[1]
    assert not [r for r in caplog.records if r.exc_info or r.name.startswith("aiohttp")]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0] == "refused a malformed request from 127.0.0.1 with 400: Invalid method encountered: b'GARBAGE'"
    assert lines[1].startswith("refused a malformed request from 127.0.0.1 with 400: "
                               "Invalid character in Content-Length")


def test_a_burst_of_whole_requests_over_the_cap_loses_none_that_had_arrived_whole():
    # Seven clients each send a whole request at once to a server of five connections: the five let in
    # are answered (none closed to make room before its handler ran), and the other two refused: a 503,
    # or where its request reached the refused socket after the server closed it, the reset that follows.
    # Each answer streams 50 tokens (a few hundred ms), so none of the five frees its connection before the
    # seventh client has connected: with 2 tokens, a busy machine let one finish first and the seventh in.
    body = json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 50}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)

    async def main(port):
        clients = []
        for _ in range(7):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            clients.append((reader, writer))
        replies = [await read_until_closed(reader, 20) for reader, _ in clients]
        for _, writer in clients:
            writer.close()
        return replies

    with serving(max_connections=5) as url:
        replies = asyncio.run(main(int(url.rsplit(":", 1)[1])))
    statuses = [reply.split(b"\r\n", 1)[0] for reply in replies]
    assert statuses[:5] == [b"HTTP/1.1 200 OK"] * 5, statuses
    assert set(statuses[5:]) <= {b"HTTP/1.1 503 Service Unavailable", b""}, statuses


def test_making_room_passes_over_a_connection_whose_request_the_loop_has_not_read():
    """A busy loop reads a burst's whole requests late: a connection holding unread bytes is a request on its
    way, so the one without any is closed to make room, though it came later."""
    import socket as socket_module

    from tokenpath.serve.connections import ConnectionLimits, Connections, _Guard

    async def main():
        connections = Connections(ConnectionLimits(max_connections=2))
        pairs = [socket_module.socketpair() for _ in range(2)]
        guards = []
        for ours, _ in pairs:
            guard = _Guard(connections, None)
            guard.socket = ours
            guards.append(guard)
            assert connections.admit(guard) == "in"
        head = b"POST /v1/completions HTTP/1.1\r\n"
        pairs[0][1].sendall(head)  # the older one holds a request's first bytes
        long_ago = asyncio.get_running_loop().time() - 1.0
        for guard in guards:
            connections.waiting[guard] = long_ago
        unread = [guard.unread_bytes() for guard in guards]
        made_room = connections.make_room()
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
        return unread, made_room, [guard in connections.open for guard in guards]

    unread, made_room, still_open = asyncio.run(main())
    assert unread == [len(b"POST /v1/completions HTTP/1.1\r\n"), 0]
    assert made_room and still_open == [True, False]
