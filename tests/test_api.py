"""The public Python API (docs/api.md): what `import tokenpath` exports, and that docs/api.md's example runs."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import tokenpath
from tokenpath.config.errors import UserError
from tokenpath.sim import scenario, simulate, summary
from tokenpath.sim.document import result_document

DOCS = pathlib.Path(__file__).parent.parent / "docs"
SMALL = {"workload.num_requests": 200}


def test_the_public_names_are_the_simulation_packages_own():
    assert tokenpath.__all__ == ["Scenario", "Simulation", "load_scenario", "load_summary", "simulate"]
    assert tokenpath.load_scenario is scenario.load_scenario and tokenpath.Scenario is scenario.Scenario
    assert tokenpath.simulate is simulate.simulate and tokenpath.Simulation is simulate.Simulation
    assert tokenpath.load_summary is summary.load_summary
    assert set(tokenpath.__all__) <= set(dir(tokenpath))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tokenpath.nothing  # noqa: B018


def test_importing_the_package_imports_nothing_else():
    """The command line imports the package: the simulation loads on first use of a public name."""
    code = ("import sys, tokenpath; before = sorted(m for m in sys.modules if m.startswith('tokenpath')); "
            "tokenpath.simulate; print(before, 'tokenpath.sim.simulate' in sys.modules)")
    src = str(pathlib.Path(tokenpath.__file__).parent.parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": src}).stdout
    assert out.split() == ["['tokenpath']", "True"]


def test_a_simulations_summary_is_its_result_document_built_once():
    sim = tokenpath.simulate(tokenpath.load_scenario(overrides=SMALL))
    document = sim.summary
    assert document == result_document(sim)[0]
    assert document["schema"] == summary.SCHEMA and document["requests"]["completed"] == 200
    assert sim.summary is document


def test_a_summary_reads_back_from_its_file(tmp_path):
    document = tokenpath.simulate(tokenpath.load_scenario(overrides=SMALL)).summary
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    assert tokenpath.load_summary(path) == json.loads(json.dumps(document))
    path.write_text(json.dumps({**document, "schema": "tokenpath.levers/1"}), encoding="utf-8")
    with pytest.raises(UserError) as error:
        tokenpath.load_summary(path)
    assert str(error.value) == f"{path}: not a {summary.SCHEMA} summary (schema is 'tokenpath.levers/1')"


def test_the_example_in_docs_api_md_runs(capsys):
    code = re.search(r"```python\n(.*?)```", (DOCS / "api.md").read_text(encoding="utf-8"), re.S).group(1)
    exec(compile(code, "docs/api.md", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert len(printed) == 2 and float(printed[1]) < float(printed[0])  # async detokenization shortens E2E
