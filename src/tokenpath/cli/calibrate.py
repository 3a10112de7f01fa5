"""`tokenpath calibrate delivery`: this machine's last-mile host cost."""

from __future__ import annotations

from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokenpath import files
from tokenpath.cli.app import calibrate_app, console, err_console
from tokenpath.cli.options import check_tokenizer
from tokenpath.errors import UserError, quoted


def _batch_sizes(given: str, extra: list[str]) -> list[int]:
    """--batch-sizes takes "1,8,32" or "1 8 32" (the values after the flag)."""
    words = given.replace(",", " ").split() + extra
    try:
        sizes = sorted({int(word) for word in words})
    except ValueError:
        raise UserError(f"--batch-sizes: {quoted(' '.join(words))} must be whole numbers, e.g. --batch-sizes 1 8 32 128 256") from None
    if not sizes or sizes[0] < 1:
        raise UserError(f"--batch-sizes: {quoted(' '.join(words))} must be batch sizes >= 1, e.g. --batch-sizes 1 8 32 128 256")
    return sizes


CALIBRATE_DELIVERY_EXAMPLE = """
Measures detokenize + stop-string check + SSE framing per engine step at several batch sizes and
writes a file that a scenario names as `delivery.calibration = "delivery-calibration.toml"`.

Examples:

  tokenpath calibrate delivery

  tokenpath calibrate delivery --tokenizer tokenizer.model.v1 --batch-sizes 1 8 32 128 256

  tokenpath calibrate delivery --tokenizer path/to/tokenizer.json --out my-host.toml
"""


@calibrate_app.command("delivery", help="Measure this machine's last-mile host cost per batch size." + CALIBRATE_DELIVERY_EXAMPLE,
                       context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def calibrate_delivery(
    ctx: typer.Context,
    tokenizer: Optional[str] = typer.Option(
        None, help="tokenizer.json, tekken*.json, SentencePiece .model, or a name shipped with mistral-common "
                   "(default: tekken_240911.json)"),
    out: str = typer.Option("delivery-calibration.toml", help="calibration file to write"),
    batch_sizes: str = typer.Option("1 8 32 128 256", "--batch-sizes", help="batch sizes to measure, e.g. 1 8 32 128 256"),
    steps: int = typer.Option(200, min=10, help="engine steps per measurement"),
    repeats: int = typer.Option(5, min=1, help="repeats per measurement; the median is kept"),
) -> None:
    from rich.table import Table

    from tokenpath.delivery import Detokenizer
    from tokenpath.delivery.measure import calibrate

    sizes = _batch_sizes(batch_sizes, list(ctx.args))
    files.check_writable(out, "--out")
    check_tokenizer(tokenizer, "--tokenizer")
    det = Detokenizer.load(tokenizer)
    progress = Progress(TextColumn("measuring batch sizes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err_console, transient=True)
    with progress:
        task = progress.add_task("calibrate", total=len(sizes))
        calibration = calibrate(det, sizes, steps=steps, repeats=repeats, progress=lambda _: progress.advance(task))
    calibration.write(out)
    table = Table(title=f"last-mile host cost on {calibration.machine['cpu']} ({det.name})")
    for column in ("batch", "step (fixed)", "per token", "of which framing", "whole step", "tokens/s"):
        table.add_column(column, justify="right")
    for row in calibration.batches:
        table.add_row(str(row.batch_size), f"{row.step_s * 1e6:.1f} us", f"{row.per_token_s * 1e6:.2f} us",
                      f"{row.frame_per_event_s * 1e6:.2f} us", f"{row.total_s * 1e6:.1f} us",
                      f"{row.batch_size / row.total_s:,.0f}")
    console.print(table)
    console.print(f"wrote {out}; use it with delivery.calibration = {out!r} in a scenario")
