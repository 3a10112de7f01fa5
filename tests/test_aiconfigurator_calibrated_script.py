"""benchmarks/aiconfigurator_calibrated.py's choice of configurations (the parts it computes without its peer's
wheel)."""

import sys
from pathlib import Path

import pandas as pd

from benchmark_scripts import load_benchmark


def _script():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # (it imports its sibling)
    try:
        return load_benchmark("aiconfigurator_calibrated")
    finally:
        sys.path.pop(0)


def _runs(rows):
    """Unshipped runs as candidate_runs gives them: a configuration's columns, a concurrency and the source."""
    return pd.DataFrame([{"backend": backend, "model_path": "meta-llama/Llama-3.1-70B", "system": "h200_sxm",
                          "tp_size": tp, "isl": 1024, "osl": 1024, "gemm_quant_mode": "fp8", "concurrency": c,
                          "silicon_data_source": f"model=x; silicon_concurrency={int(c)}; measured={day}T00:00:00"}
                         for backend, tp, c, day in rows])


def test_a_configuration_is_one_engine_model_chip_and_day_at_three_or_more_concurrencies_by_concurrency():
    script = _script()
    runs = _runs([("vllm", 8, 16, "2025-10-29"), ("vllm", 8, 4, "2025-10-29"), ("vllm", 8, 64, "2025-10-29"),
                  ("vllm", 8, 8, "2025-11-02"),  # another day: another configuration, with one load
                  ("trtllm", 8, 4, "2025-10-29"), ("trtllm", 8, 8, "2025-10-29"),  # two loads only
                  ("vllm", 4, 4, "2025-10-29"), ("vllm", 4, 8, "2025-10-29"), ("vllm", 4, 32, "2025-10-29")])
    drawn = script.configurations(runs, 10, seed=1)
    assert sorted((g.iloc[0].backend, int(g.iloc[0].tp_size)) for g in drawn) == [("vllm", 4), ("vllm", 8)]
    for group in drawn:  # each by concurrency: the first is the one fitted on
        assert list(group.concurrency) == sorted(group.concurrency)
        assert set(group.measured) == {"2025-10-29"}
    assert len(script.configurations(runs, 1, seed=1)) == 1  # --configurations caps the draw
    # the draw is the seed's: the same seed, the same configurations in the same order
    assert [tuple(g.index) for g in script.configurations(runs, 2, seed=7)] == \
        [tuple(g.index) for g in script.configurations(runs, 2, seed=7)]
