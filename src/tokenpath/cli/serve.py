"""`tokenpath serve`: the OpenAI-compatible server on simulated timing."""

from __future__ import annotations

from typing import Any

import typer

from tokenpath.cli.app import app, err_console
from tokenpath.cli.options import ARRIVAL_AND_PROMPT_FLAGS, check_tokenizer, load_with_flags, scenario_flags
from tokenpath.config import files
from tokenpath.config.errors import UserError, quoted


@app.command(help="Serve an OpenAI-compatible API that streams real text on the scenario's simulated timing."
             "\n\nExample:\n\n  tokenpath serve --port 8000\n\n"
             "  curl -N localhost:8000/v1/completions "
             "-d '{\"model\": \"m\", \"prompt\": \"Hi\", \"max_tokens\": 20, \"stream\": true}'")
@scenario_flags(omit=ARRIVAL_AND_PROMPT_FLAGS)  # its clients send their own prompts, when they like
def serve(
    scenario: str | None = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    host: str = typer.Option("127.0.0.1", help="address to bind; other hosts reach it only if you say so"),
    port: int = typer.Option(8000, help="TCP port"),
    api_key: str | None = typer.Option(None, "--api-key", help="require 'Authorization: Bearer KEY'"),
    served_model_name: str | None = typer.Option(None, "--served-model-name", help="the only model name accepted"),
    tokenizer: str | None = typer.Option(None, help="tokenizer file (HF tokenizer.json, Tekken, SentencePiece)"),
    send_log: str | None = typer.Option(None, "--send-log", help="append each SSE event's send time (JSONL)"),
    network_delay: bool = typer.Option(
        True, "--network-delay/--no-network-delay",
        help="delay what is received and sent by the scenario's network (half its RTT plus the bytes at its "
             "bandwidth), as simulate does; off to measure the server alone over loopback"),
    header_timeout: float | None = typer.Option(
        None, "--header-timeout", min=0.001,
        help="seconds a connection has to send a complete request head (default 20)"),
    body_timeout: float | None = typer.Option(
        None, "--body-timeout", min=0.001, help="seconds a request has to send its whole body (default 60)"),
    idle_timeout: float | None = typer.Option(
        None, "--idle-timeout", min=0.001, help="seconds an idle keep-alive connection stays open (default 5)"),
    max_connections: int | None = typer.Option(
        None, "--max-connections", min=1,
        help="open connections at most (default: the open-file limit less 64); when full, the longest idle "
             "or slowest-to-send one is closed to make room, else the new one gets a 503"),
    *, flags: dict[str, Any],
) -> None:
    from tokenpath.serve import ServeOptions, make_app
    from tokenpath.serve.app import SERVER, run
    from tokenpath.serve.connections import ConnectionLimits

    if api_key is not None and (not api_key.strip() or api_key != api_key.strip()):
        raise UserError(f"--api-key: {quoted(api_key)} " + ("is empty, which would let in every client sending "
                        "'Bearer '" if not api_key.strip() else "starts or ends with white space, which no "
                        "Authorization header can carry") + "; give a key, or leave out --api-key to serve anyone")
    if served_model_name is not None and not served_model_name.strip():
        raise UserError("--served-model-name: empty; give the one model name to accept, or leave it out to accept "
                        "any")
    check_listen(host, port)
    if send_log is not None:
        files.check_writable(send_log, "--send-log")
    check_tokenizer(tokenizer, "--tokenizer")
    given = {"header_timeout_s": header_timeout, "body_timeout_s": body_timeout, "idle_timeout_s": idle_timeout,
             "max_connections": max_connections}
    limits = ConnectionLimits(**{key: value for key, value in given.items() if value is not None})
    options = ServeOptions(api_key, served_model_name, tokenizer, send_log, limits=limits, network_delay=network_delay)
    application = make_app(load_with_flags(scenario, flags), options)
    name = application[SERVER].model_name
    try:
        run(application, host, port,
            on_ready=lambda bound: err_console.print(f"serving {name} on http://{host}:{bound}/v1 (Ctrl-C stops)"))
    except OSError as error:  # the address was taken between check_listen and now
        raise UserError(f"--host/--port: cannot listen on {host}:{port} ({error.strerror or error}); "
                        "choose another --port") from None


def check_listen(host: str, port: int) -> None:
    """Refuse, before loading anything, an address serve cannot listen on: a port out of range, a host
    that is not an address of this machine, a port in use or reserved."""
    import socket

    if not 0 <= port <= 65535:
        raise UserError(f"--port: {port} is not a TCP port; use 1 to 65535 (0: any free port)")
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise UserError(f"--host: cannot listen on {quoted(host)} ({reason}); give an address of this machine, "
                        "e.g. 127.0.0.1") from None
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
            try:
                probe.bind(address)
            except OSError as error:
                raise UserError(f"--host/--port: cannot listen on {host}:{port} ({error.strerror}); choose another "
                                "--port, or stop what holds it") from None
