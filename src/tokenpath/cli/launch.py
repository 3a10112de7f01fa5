"""`tokenpath launch`: the commands and files that start a scenario's deployment on a real engine."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from tokenpath.cli.app import app, console
from tokenpath.cli.options import load_with_flags, scenario_flags
from tokenpath.config import files
from tokenpath.config.errors import UserError

LAUNCH_EXAMPLE = """
Writes how to start the scenario's deployment: a shell script of `vllm serve`, SGLang's launch_server
(and its router for disaggregated pools) or `trtllm-serve` with the YAML it reads, or a Kubernetes
manifest (a Deployment and a Service per pool, one pod per replica) running the engine the scenario's
scheduler profile models. Every flag is one that engine version defines (docs/launch.md lists the
mapping and where each flag is defined); each file opens with the scenario settings no flag carries.
The model is the catalog's Hugging Face id; --model-id serves another checkpoint.

Examples:

  tokenpath launch --engine vllm

  tokenpath launch my.toml --engine k8s --out deploy/

  tokenpath launch --engine sglang --tp 2 --set deployment.prefill_replicas=1 --out pd/
"""
EXECUTABLE = 0o755  # the shell scripts written into --out


@app.command(help="The commands and files that launch the scenario's deployment on vLLM, SGLang, TensorRT-LLM or "
                  "Kubernetes." + LAUNCH_EXAMPLE)
@scenario_flags()
def launch(
    scenario: str | None = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    engine: str = typer.Option(..., "--engine", help="vllm, sglang, trtllm or k8s"),
    out: str | None = typer.Option(None, "--out", help="write the files into this folder (created); default: print "
                                                       "them"),
    model_id: str | None = typer.Option(None, "--model-id", help="the checkpoint to serve (a Hugging Face id or "
                                                                 "path), instead of the catalog's"),
    *, flags: dict[str, Any],
) -> None:
    from tokenpath.launch import launch_files

    check_launch_request(engine, out)
    write_launch_files(launch_files(load_with_flags(scenario, flags), engine, model_id), out)


def check_launch_request(engine: str, out: str | None, flag: str = "--engine") -> None:
    """A launch target and folder checked before any work: one line naming the flag at fault."""
    from tokenpath.launch import ENGINES

    if engine not in ENGINES:
        raise UserError(f"{flag}: unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if out is not None:
        _check_folder(out)


def write_launch_files(written: dict[str, str], out: str | None) -> None:
    """Launch files (name -> text) printed, or written into `out` (created; scripts made executable)."""
    if out is None:
        for name, text in written.items():
            sys.stdout.write(f"# ==> {name} <==\n{text}\n")
        return
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in written.items():
            (folder / name).write_text(text, encoding="utf-8")
            if name.endswith(".sh"):
                os.chmod(folder / name, EXECUTABLE)
    except OSError as error:
        raise UserError(f"--out {files.shown(out)}: cannot write there ({error.strerror}); choose another "
                        "folder") from None
    console.print(f"wrote {', '.join(written)} into {files.shown(out)}", highlight=False)


def _check_folder(out: str) -> None:
    problem = files.path_problem(out)
    if problem is not None:
        raise UserError(f"--out {files.shown(out)!r}: {problem}; give a folder")
    if Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"--out {files.shown(out)}: is a file; give a folder for the launch files")
