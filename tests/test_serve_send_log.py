"""tokenpath serve over loopback: the --send-log file as the run goes, and the API key check."""

import asyncio
import json
import time

import aiohttp
from aiohttp import web

from tokenpath import load_scenario
from tokenpath.serve import ServeOptions, make_app

FAST = {"model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1, "delivery.network_rtt": 0}


def _serve(options: ServeOptions, body):
    """Run `body(base_url, session)` against a live server on a free loopback port."""

    async def main():
        runner = web.AppRunner(make_app(load_scenario("typical", FAST), options))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session:
                return await body(f"http://127.0.0.1:{port}", session)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_send_log_records_arrivals_and_is_written_as_the_run_goes(tmp_path):
    log = tmp_path / "sends.jsonl"

    async def body(url, session):
        request = {"model": "m", "prompt": "Once upon a time", "max_tokens": 6, "stream": True}
        sent_ns = time.perf_counter_ns()
        async with session.post(f"{url}/v1/completions", json=request) as response:
            received = [piece async for piece in response.content.iter_any()]
        await asyncio.sleep(0)  # the loop pass that wrote the last lines ends
        return sent_ns, received, log.read_text()  # read while the server still runs

    sent_ns, received, during = _serve(ServeOptions(send_log=str(log)), body)
    lines = [json.loads(line) for line in during.splitlines()]
    arrival, events = lines[0], lines[1:]
    assert set(arrival) == {"id", "arrival_ns", "submitted_ns"} and arrival["id"].startswith("cmpl-")
    # one clock, perf_counter: sent, its handler began, handed to the engine, its first event written
    assert sent_ns <= arrival["arrival_ns"] <= arrival["submitted_ns"] <= events[0]["send_ns"]
    assert [e["event"] for e in events] == list(range(len(events))) and len(events) >= 6
    assert {e["id"] for e in events} == {arrival["id"]}
    assert log.read_text() == during  # nothing was held back until exit


def test_the_bearer_scheme_is_case_insensitive():
    async def body(url, session):
        statuses = []
        for value in ("Bearer sekret", "bearer sekret", "BEARER  sekret", "Bearer nope", "Basic sekret",
                      "Bearersekret", "sekret", ""):
            async with session.get(f"{url}/v1/models", headers={"Authorization": value}) as response:
                statuses.append(response.status)
        return statuses

    assert _serve(ServeOptions(api_key="sekret"), body) == [200, 200, 200, 401, 401, 401, 401, 401]
