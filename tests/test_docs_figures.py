"""Figures the docs quote come from the runs they describe: the README's excerpt of `tokenpath run` is
the default scenario's output today, line for line, so a change to the model that moves a figure fails
here until the excerpt is pasted again."""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from tokenpath import load_scenario, simulate
from tokenpath.report.simulation import describe
from tokenpath.report.table import print_summary
from tokenpath.sim.document import result_document

README = Path(__file__).resolve().parents[1] / "README.md"
# The README shows the run at the width of an 80-column terminal.
WIDTH = 80


def _readme_excerpt() -> list[str]:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"The end\s+of it:\n\n```\n(.*?)```", text, re.S)
    assert block, "README.md: the excerpt of `tokenpath run` after 'The end of it:' is missing"
    return [line.rstrip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_excerpt_of_tokenpath_run_is_todays_output():
    simulation = simulate(load_scenario(None))
    document, reason = result_document(simulation)
    console = Console(width=WIDTH, record=True, file=open("/dev/null", "w"), color_system=None)
    print_summary(console, document, describe(simulation), reason)
    output = [line.rstrip() for line in console.export_text().splitlines()]
    position = 0
    for line in _readme_excerpt():
        try:
            position = output.index(line, position) + 1
        except ValueError:
            raise AssertionError(f"README.md quotes {line!r}, which `tokenpath run` no longer prints; paste its "
                                 "output again:\n" + "\n".join(output)) from None
