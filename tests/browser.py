"""Open a page in headless Chromium and read it through the Chrome DevTools Protocol (aiohttp's
websocket client): what the page logged as errors, what it fetched, and the value of a script."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

# The flags that run Chromium here: no sandbox (root in a container), no GPU, and nothing that
# reaches the network by itself.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1"]
START_TIMEOUT_S = 30.0


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def open_page(url: str, script: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Load `url`, then evaluate `script` (an expression; a promise is awaited). Returns {"value",
    "errors": console errors and uncaught exceptions, "requests": every URL the page asked for}."""
    # Chromium's helper processes can still write to the profile as the browser exits: they are ended
    # with it (one process group), and a file they leave behind does not fail the test.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        process = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port = _port(Path(profile) / "DevToolsActivePort", process)
            return asyncio.run(asyncio.wait_for(_session(port, url, script), timeout_s))
        finally:
            _end(process)


def _end(process: subprocess.Popen) -> None:
    """Terminate the browser and every process it started; kill them if they linger."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _port(active: Path, process: subprocess.Popen) -> int:
    """Chromium writes the port it chose (port 0 asked for any) into the profile."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with status {process.returncode} before it listened")
        if active.exists() and active.read_text().strip():
            return int(active.read_text().split()[0])
        time.sleep(0.05)
    raise RuntimeError("chromium did not open its debugging port")


async def _session(port: int, url: str, script: str) -> dict[str, Any]:
    errors: list[str] = []
    requests: list[str] = []
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as reply:
            pages = [target for target in await reply.json() if target["type"] == "page"]
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 1 << 30))
            loaded = asyncio.Event()

            async def call(method: str, **params: Any) -> dict[str, Any]:
                number = next(ids)
                await ws.send_str(json.dumps({"id": number, "method": method, "params": params}))
                while True:
                    message = json.loads((await ws.receive()).data)
                    if message.get("id") == number:
                        if "error" in message:
                            raise RuntimeError(f"{method}: {message['error']}")
                        return message["result"]
                    event(message)

            def event(message: dict[str, Any]) -> None:
                method, params = message.get("method"), message.get("params", {})
                if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                    errors.append(" ".join(str(arg.get("value", arg.get("description"))) for arg in params["args"]))
                elif method == "Runtime.exceptionThrown":
                    details = params["exceptionDetails"]
                    errors.append(details.get("exception", {}).get("description") or details.get("text"))
                elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                    errors.append(params["entry"]["text"])
                elif method == "Network.requestWillBeSent":
                    requests.append(params["request"]["url"])
                elif method == "Page.loadEventFired":
                    loaded.set()

            for domain in ("Runtime", "Log", "Network", "Page"):
                await call(f"{domain}.enable")
            await call("Page.navigate", url=url)
            while not loaded.is_set():
                event(json.loads((await ws.receive()).data))
            result = await call("Runtime.evaluate", expression=script, awaitPromise=True, returnByValue=True)
            if "exceptionDetails" in result:
                errors.append(str(result["exceptionDetails"]))
            await asyncio.sleep(0.2)  # errors logged just after the charts drew
            await call("Runtime.evaluate", expression="0")
            return {"value": result.get("result", {}).get("value"), "errors": errors, "requests": requests}


def in_ci() -> bool:
    return bool(os.environ.get("CI"))
