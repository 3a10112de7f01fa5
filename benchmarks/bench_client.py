"""How many streamed tokens/s can a benchmark client take while its timestamps stay within 1 ms?

A fast loopback streaming server (in this file, run as its own process) imitates an engine: every
`--step-ms` it sends one SSE event, one token, to every open stream, as continuous batching does,
and it logs each event's send time (CLOCK_MONOTONIC and CLOCK_REALTIME, taken just before the write).
Each client runs closed-loop at a concurrency of B streams, so the offered load is B / step tokens/s;
its timestamp error per event is the client's recorded arrival minus the server's send time.

Clients, side by side in one run:
- tokenpath bench (this project);
- guidellm (PyPI), run from its own virtual environment: `--guidellm PATH/bin/guidellm`;
- vLLM's `vllm bench serve`, which runs without a GPU: `--vllm PATH/bin/vllm`.
A peer that is not given is left out. Server and clients run on CPUs of their own where the machine
has two or more, at a raised priority where permitted, every client alike, so that other work on the
machine disturbs the comparison as little as it can.

How each client's records are matched to the server's log: tokenpath keeps every arrival with its
token count and the response id (error over every token); vLLM keeps each request's start
(perf_counter, the same monotonic clock as the server's), its TTFT and every inter-token gap, and the
generated text, whose first token " r<id>" names the request (error over every token); guidellm keeps
the response id and the unix times of the first and last token of each request (error over those
two). A load passes when the p99 error is under 1 ms and the server sent at least 80% of the offered
tokens/s; the table also gives the highest load under 5 ms, so that clients that never meet 1 ms still
compare. Each client's sweep goes up until its p99 error passes 20 ms or it falls behind the offer.

    python benchmarks/bench_client.py --guidellm /tmp/venv-guidellm/bin/guidellm --vllm /tmp/venv-vllm/bin/vllm

prints the table (and with --json PATH writes every trial).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ERROR_LIMIT_S = 1e-3
# A looser bar too, so clients that never meet 1 ms on a machine still compare; and where a sweep stops.
LOOSE_LIMIT_S = 5e-3
STOP_S = 20e-3

# ---------------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------------
_HEAD_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")


def _json_response(status: str, document: dict) -> bytes:
    body = json.dumps(document).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _Stream:
    __slots__ = ("transport", "rid", "k", "n", "chat", "usage", "prompt_tokens", "include_usage")

    def __init__(self, transport, rid, n, chat, usage, include_usage, prompt_tokens):
        self.transport, self.rid, self.k, self.n = transport, rid, 0, n
        self.chat, self.usage, self.include_usage, self.prompt_tokens = chat, usage, include_usage, prompt_tokens


class _Server:
    def __init__(self, step_s: float, log_path: str) -> None:
        self.step_s, self.log_path = step_s, log_path
        self.active: list[_Stream] = []
        self.next_rid = 0
        self.log_rid: list[int] = []
        self.log_k: list[int] = []
        self.log_mono: list[int] = []
        self.log_wall: list[int] = []

    def event(self, stream: _Stream, finish: bool) -> bytes:
        text = f" r{stream.rid}" if stream.k == 0 else " x"
        reason = '"length"' if finish else "null"
        if stream.chat:
            choice = f'{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":{reason}}}'
            kind = "chat.completion.chunk"
        else:
            choice = f'{{"index":0,"text":"{text}","logprobs":null,"finish_reason":{reason}}}'
            kind = "text_completion"
        usage = ""
        if stream.usage:
            done = stream.k + 1
            usage = (f',"usage":{{"prompt_tokens":{stream.prompt_tokens},"completion_tokens":{done},'
                     f'"total_tokens":{stream.prompt_tokens + done}}}')
        return (f'data: {{"id":"cmpl-{stream.rid}","object":"{kind}","created":0,"model":"bench",'
                f'"choices":[{choice}]{usage}}}\n\n').encode()

    def tick(self) -> None:
        loop = asyncio.get_running_loop()
        keep = []
        mono, wall = time.perf_counter_ns, time.time_ns
        for stream in self.active:
            if stream.transport.is_closing():
                continue
            last = stream.k + 1 == stream.n
            data = self.event(stream, last)
            if last:
                tail = b""
                if stream.include_usage:
                    tail += (f'data: {{"id":"cmpl-{stream.rid}","object":"text_completion","created":0,"model":"bench",'
                             f'"choices":[],"usage":{{"prompt_tokens":{stream.prompt_tokens},"completion_tokens":{stream.n},'
                             f'"total_tokens":{stream.prompt_tokens + stream.n}}}}}\n\n').encode()
                tail += b"data: [DONE]\n\n"
                frame = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(data), data, len(tail), tail)
            else:
                frame = b"%x\r\n%s\r\n" % (len(data), data)
            self.log_rid.append(stream.rid)
            self.log_k.append(stream.k)
            self.log_mono.append(mono())
            self.log_wall.append(wall())
            stream.transport.write(frame)
            stream.k += 1
            if not last:
                keep.append(stream)
        self.active = keep
        self._next += self.step_s
        now = loop.time()
        if self._next < now:
            self._next = now
        loop.call_at(self._next, self.tick)

    def dump(self) -> None:
        np.savez(self.log_path, rid=np.array(self.log_rid, np.int64), k=np.array(self.log_k, np.int64),
                 mono=np.array(self.log_mono, np.int64), wall=np.array(self.log_wall, np.int64))


class _Conn(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
        self.server, self.buffer, self.transport = server, b"", None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            match = re.search(r"(?im)^content-length:\s*(\d+)", head)
            length = int(match.group(1)) if match else 0
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            self.handle(head.split("\r\n", 1)[0], body)

    def handle(self, line: str, body: bytes) -> None:
        method, path = line.split(" ")[:2]
        path = path.split("?")[0]
        if method == "GET" and path.endswith("/models"):
            self.transport.write(_json_response(
                "200 OK", {"object": "list", "data": [{"id": "bench", "object": "model"}]}))
            return
        if method == "GET":  # /health, /version and the like
            self.transport.write(_json_response("200 OK", {}))
            return
        if method != "POST" or not path.endswith("completions"):
            self.transport.write(_json_response("404 Not Found", {"error": {"message": f"no route {path}"}}))
            return
        request = json.loads(body)
        options = request.get("stream_options") or {}
        server = self.server
        n = int(request.get("max_tokens") or request.get("max_completion_tokens") or 100)
        prompt = request.get("prompt") or json.dumps(request.get("messages", ""))
        stream = _Stream(self.transport, server.next_rid, max(n, 1), "messages" in request,
                         bool(options.get("continuous_usage_stats")), bool(options.get("include_usage")),
                         max(1, len(str(prompt)) // 4))
        server.next_rid += 1
        self.transport.write(_HEAD_SSE)
        server.active.append(stream)


async def _serve(port: int, step_s: float, log_path: str, ready_path: str) -> None:
    loop = asyncio.get_running_loop()
    server = _Server(step_s, log_path)
    listener = await loop.create_server(lambda: _Conn(server), "127.0.0.1", port, backlog=4096, reuse_address=True)
    bound = listener.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    server._next = loop.time() + step_s
    loop.call_at(server._next, server.tick)
    Path(ready_path).write_text(str(bound))
    await stop.wait()
    listener.close()
    server.dump()


def serve_main(args: argparse.Namespace) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve(args.port, args.step_ms / 1e3, args.log, args.ready))


class ServerProcess:
    """The streaming server as a process of its own, on its own CPU where there is one to spare."""

    def __init__(self, step_ms: float, workdir: Path, cpu: int | None) -> None:
        self.log = workdir / "server_log.npz"
        ready = workdir / "server_port"
        command = [sys.executable, __file__, "serve", "--step-ms", str(step_ms), "--log", str(self.log),
                   "--ready", str(ready)]
        self.process = subprocess.Popen(command, preexec_fn=lambda: _isolate({cpu} if cpu is not None else None))
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{ready.read_text()}"

    def stop(self) -> dict[str, np.ndarray]:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        data = np.load(self.log)
        return {key: data[key] for key in data.files}


# ---------------------------------------------------------------------------------------------------
# Matching a client's records to the server's log
# ---------------------------------------------------------------------------------------------------
def _send_table(log: dict[str, np.ndarray], clock: str) -> dict[tuple[int, int], int]:
    return dict(zip(zip(log["rid"].tolist(), log["k"].tolist()), log[clock].tolist()))


def _rid_of_text(text: str) -> int | None:
    match = re.match(r"\s*r(\d+)", text or "")
    return int(match.group(1)) if match else None


def errors_tokenpath(results: Path, log: dict[str, np.ndarray]) -> np.ndarray:
    sends = _send_table(log, "mono")
    lines = results.read_text().splitlines()
    t0 = json.loads(lines[0])["t0_monotonic_ns"]
    errors = []
    for line in lines[1:]:
        row = json.loads(line)
        if not row["ok"] or not row.get("id"):
            continue
        rid = int(row["id"].split("-")[-1])
        times = np.repeat(np.array(row["arrival_ns"], np.int64) + t0, row["arrival_tokens"])
        for k, arrival in enumerate(times.tolist()):
            if (rid, k) in sends:
                errors.append(arrival - sends[(rid, k)])
    return np.array(errors, np.int64)


def errors_vllm(result: Path, log: dict[str, np.ndarray]) -> np.ndarray:
    """vLLM keeps each request's start (perf_counter, the server's monotonic clock), TTFT and gaps."""
    sends = _send_table(log, "mono")
    document = json.loads(result.read_text())
    errors = []
    starts = document.get("start_times")
    if starts is None:
        raise RuntimeError("vLLM's detailed result has no start_times; cannot place its token times")
    for start, ttft, itls, text in zip(starts, document["ttfts"], document["itls"], document["generated_texts"]):
        rid = _rid_of_text(text)
        if rid is None or not ttft:
            continue
        times = start + ttft + np.concatenate(([0.0], np.cumsum(itls)))
        for k, arrival in enumerate(times.tolist()):
            if (rid, k) in sends:
                errors.append(int(arrival * 1e9) - sends[(rid, k)])
    return np.array(errors, np.int64)


def errors_guidellm(report: Path, log: dict[str, np.ndarray]) -> np.ndarray:
    """guidellm keeps, per request, the unix times of its first and last token iterations."""
    sends = _send_table(log, "wall")
    last_k: dict[int, int] = {}
    for rid, k in zip(log["rid"].tolist(), log["k"].tolist()):
        last_k[rid] = max(k, last_k.get(rid, 0))
    errors = []
    for benchmark in json.loads(report.read_text())["benchmarks"]:
        for record in benchmark["requests"]["successful"]:
            match = re.match(r"cmpl-(\d+)$", record.get("response_id") or "")
            rid = int(match.group(1)) if match else _rid_of_text(record.get("output") or "")
            timings = record["info"]["timings"]
            if rid is None or rid not in last_k or timings.get("first_token_iteration") is None:
                continue
            errors.append(int(timings["first_token_iteration"] * 1e9) - sends[(rid, 0)])
            if timings.get("last_token_iteration") is not None:
                errors.append(int(timings["last_token_iteration"] * 1e9) - sends[(rid, last_k[rid])])
    return np.array(errors, np.int64)


# ---------------------------------------------------------------------------------------------------
# Running the clients
# ---------------------------------------------------------------------------------------------------
def run_tokenpath(url: str, streams: int, requests: int, output_len: int, workdir: Path, workers: int,
                  cpus: set[int] | None, loop_timestamps: bool = False) -> Path:
    results = workdir / "tokenpath.jsonl"
    command = [sys.executable, "-m", "tokenpath", "bench", "--base-url", url, "--model", "bench",
               "--request-rate", "inf", "--max-concurrency", str(streams), "--num-requests", str(requests),
               "--input-len", "32", "--input-sd", "0", "--output-len", str(output_len), "--output-sd", "0",
               "--workers", str(workers), "--results", str(results), "--json", str(workdir / "tokenpath.json")]
    if loop_timestamps:
        command.append("--loop-timestamps")
    _run(command, cpus)
    return results


def run_vllm(vllm: str, url: str, streams: int, requests: int, output_len: int, workdir: Path, tokenizer: Path,
             cpus: set[int] | None) -> Path:
    command = [vllm, "bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
               "--model", "bench", "--tokenizer", str(tokenizer), "--dataset-name", "random",
               "--random-input-len", "32", "--random-output-len", str(output_len), "--ignore-eos",
               "--num-prompts", str(requests), "--request-rate", "inf", "--max-concurrency", str(streams),
               "--save-result", "--save-detailed", "--result-dir", str(workdir), "--result-filename", "vllm.json",
               "--disable-tqdm"]
    _run(command, cpus)
    return workdir / "vllm.json"


def run_guidellm(guidellm: str, url: str, streams: int, requests: int, output_len: int, workdir: Path,
                 tokenizer: Path, cpus: set[int] | None) -> Path:
    output = workdir / "guidellm.json"
    command = [guidellm, "run",
               "--backend", f"kind=openai_http,target={url},model=bench,request_format=/v1/completions",
               "--profile", f"kind=concurrent,streams={streams}",
               "--constraint", f"kind=max_requests,count={requests}",
               "--data", f"kind=synthetic_text,prompt_tokens=32,output_tokens={output_len}",
               "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
               "--output", f"kind=json,path={output}", "--disable-console-interactive"]
    _run(command, cpus)
    return output


PRIORITY = -10  # server and client run ahead of other work on the machine, every client alike


def _isolate(cpus: set[int] | None) -> None:
    """In a child before exec: its own CPUs, and a higher priority where permitted."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        os.nice(PRIORITY)
    except OSError:
        pass


def _run(command: list[str], cpus: set[int] | None) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900,
                          preexec_fn=lambda: _isolate(cpus))
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout)[-2000:]}")


def make_tokenizer_dir(workdir: Path) -> Path:
    """A small local Hugging Face tokenizer folder for the peers' prompt generators (nothing downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tokenpath.bench import corpus_text

    folder = workdir / "tokenizer"
    folder.mkdir(exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([corpus_text()], trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 4096,
    }))
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 2000, "max_position_embeddings": 4096,
    }))
    return folder


# ---------------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------------
def trial(client: str, runner, streams: int, args, workdir: Path, server_cpu: int | None) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"{client}-{streams}-", dir=workdir))
    server = ServerProcess(args.step_ms, folder, server_cpu)
    try:
        output = runner(server.url, streams, folder)
    finally:
        log = server.stop()
    errors = {"tokenpath": errors_tokenpath, "vllm": errors_vllm,
              "guidellm": errors_guidellm}[client.split(":")[0]](output, log)
    mono = log["mono"]
    # Streamed tokens/s the client took: events sent, over the span of the sends.
    span_s = (mono.max() - mono.min()) / 1e9 if len(mono) > 1 else 0.0
    rate = len(mono) / span_s if span_s else 0.0
    ms = errors / 1e6
    row = {
        "client": client, "streams": streams, "offered_tokens_per_s": streams / (args.step_ms / 1e3),
        "tokens_per_s": float(rate), "samples": int(len(errors)),
        "p50_error_ms": float(np.percentile(ms, 50)) if len(ms) else None,
        "p99_error_ms": float(np.percentile(ms, 99)) if len(ms) else None,
        "max_error_ms": float(ms.max()) if len(ms) else None,
    }
    kept_up = rate >= 0.8 * row["offered_tokens_per_s"]
    p99 = row["p99_error_ms"]
    row["ok"] = bool(p99 is not None and p99 < ERROR_LIMIT_S * 1e3 and kept_up)
    row["ok_loose"] = bool(p99 is not None and p99 < LOOSE_LIMIT_S * 1e3 and kept_up)
    row["go_on"] = bool(p99 is not None and p99 < STOP_S * 1e3 and kept_up)
    shutil.rmtree(folder, ignore_errors=True)
    return row


def sweep(client: str, runner, args, workdir: Path, server_cpu: int | None) -> list[dict]:
    rows = []
    for streams in args.streams:
        try:
            row = trial(client, runner, streams, args, workdir, server_cpu)
        except Exception as error:  # noqa: BLE001 - a peer that breaks is reported, not fatal
            row = {"client": client, "streams": streams, "error": str(error)[-500:], "ok": False}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not row.get("go_on"):
            break  # far past its limit: higher loads only get worse
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--step-ms", type=float, default=20.0)
    serve.add_argument("--log", required=True)
    serve.add_argument("--ready", required=True)
    parser.add_argument("--guidellm", help="path to a guidellm executable (its own venv)")
    parser.add_argument("--vllm", help="path to a vllm executable (its own venv)")
    parser.add_argument("--step-ms", type=float, default=20.0, help="server step: one token per stream per step")
    parser.add_argument("--output-len", type=int, default=100, help="tokens per request")
    parser.add_argument("--rounds", type=int, default=3, help="requests per stream slot in a trial")
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 2, 5, 10, 25, 50, 100, 200, 400, 600, 800, 1200, 1600])
    parser.add_argument("--no-ablation", action="store_true", help="skip tokenpath with event-loop timestamps")
    parser.add_argument("--tokenpath-workers", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--json", help="also write the trials and the table to this JSON file")
    args = parser.parse_args()
    if args.command == "serve":
        serve_main(args)
        return

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    # The server gets a CPU of its own; the client the others (on a 2-CPU machine: one each).
    server_cpu = cpus[0] if len(cpus) >= 2 else None
    client_cpus = set(cpus[1:]) if len(cpus) >= 2 else None
    workers = args.tokenpath_workers or sorted({1, max(1, len(client_cpus or cpus))})
    workdir = Path(tempfile.mkdtemp(prefix="bench_client-"))
    tokenizer = make_tokenizer_dir(workdir)
    # At least 20 requests a trial, so even one stream gives a p99 over a fair number of events.
    n = lambda streams: max(streams * args.rounds, 20)  # noqa: E731
    clients = []
    for count in workers:
        clients.append((f"tokenpath:{count}w", lambda url, s, folder, c=count: run_tokenpath(
            url, s, n(s), args.output_len, folder, c, client_cpus)))
    if not args.no_ablation:
        # The same client with arrivals stamped when the event loop reads them, not by the kernel.
        clients.append(("tokenpath:1w:loop-stamps", lambda url, s, folder: run_tokenpath(
            url, s, n(s), args.output_len, folder, 1, client_cpus, loop_timestamps=True)))
    if args.vllm:
        clients.append(("vllm", lambda url, s, folder: run_vllm(
            args.vllm, url, s, n(s), args.output_len, folder, tokenizer, client_cpus)))
    if args.guidellm:
        clients.append(("guidellm", lambda url, s, folder: run_guidellm(
            args.guidellm, url, s, n(s), args.output_len, folder, tokenizer, client_cpus)))

    print(f"server step {args.step_ms:g} ms, {args.output_len} tokens per request, CPUs: server {server_cpu}, "
          f"clients {sorted(client_cpus) if client_cpus else 'shared'}", flush=True)
    all_rows = {name: sweep(name, runner, args, workdir, server_cpu) for name, runner in clients}
    def best_of(key: str) -> dict[str, dict | None]:
        found = {}
        for name, rows in all_rows.items():
            good = [row for row in rows if row.get(key)]
            found[name] = max(good, key=lambda row: row["tokens_per_s"]) if good else None
        return found

    def ratio_of(best: dict[str, dict | None]) -> float | None:
        peers = [row["tokens_per_s"] for name, row in best.items() if not name.startswith("tokenpath") and row]
        ours = [row["tokens_per_s"] for name, row in best.items() if name.startswith("tokenpath") and row
                and not name.endswith("loop-stamps")]
        if not ours:
            return None
        return max(ours) / max(peers) if peers else float("inf")

    best, loose = best_of("ok"), best_of("ok_loose")
    ratio, ratio_loose = ratio_of(best), ratio_of(loose)
    for title, table in ((f"p99 error < {ERROR_LIMIT_S * 1e3:g} ms", best),
                         (f"p99 error < {LOOSE_LIMIT_S * 1e3:g} ms", loose)):
        print(f"\nhighest streamed tokens/s with {title}")
        print(f"{'client':<26}{'tokens/s':>12}{'streams':>10}{'p50 err ms':>12}{'p99 err ms':>12}")
        for name, row in table.items():
            if row is None:
                print(f"{name:<26}{'none':>12}{'-':>10}{'-':>12}{'-':>12}")
            else:
                print(f"{name:<26}{row['tokens_per_s']:>12,.0f}{row['streams']:>10}{row['p50_error_ms']:>12.3f}{row['p99_error_ms']:>12.3f}")
    for title, value in (("1 ms", ratio), ("5 ms", ratio_loose)):
        if value is not None:
            shown = "no peer passes at any load" if value == float("inf") else f"{value:.1f}x"
            print(f"tokenpath / best peer at {title}: {shown}")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "benchmark": "bench_client", "step_ms": args.step_ms, "output_len": args.output_len,
            "error_limit_ms": ERROR_LIMIT_S * 1e3, "loose_limit_ms": LOOSE_LIMIT_S * 1e3, "cpus": len(cpus),
            "trials": all_rows, "best_1ms": best, "best_5ms": loose,
            "ratio_vs_best_peer_1ms": None if ratio == float("inf") else ratio,
            "ratio_vs_best_peer_5ms": None if ratio_loose == float("inf") else ratio_loose,
        }, indent=2) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
