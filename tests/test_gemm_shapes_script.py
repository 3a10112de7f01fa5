"""benchmarks/aiconfigurator_gemm_shapes.py's parts that need no AIConfigurator table: a split layer's GEMM
shapes and the layer's rate from a grid of measured rates."""

import pandas as pd
import pytest

from benchmark_scripts import load_benchmark


@pytest.fixture
def script(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return load_benchmark("aiconfigurator_gemm_shapes")


def test_a_tensor_parallel_split_narrows_each_gpus_gemms(script):
    # Llama 3.1 70B: 64 query and 8 KV heads of 128, hidden 8,192, MLP 28,672.
    assert script.layer_shapes("llama-3.1-70b", 1) == [("qkv", 10240, 8192), ("o", 8192, 8192),
                                                       ("gate_up", 57344, 8192), ("down", 8192, 28672)]
    assert script.layer_shapes("llama-3.1-70b", 8) == [("qkv", 1280, 8192), ("o", 8192, 1024),
                                                       ("gate_up", 7168, 8192), ("down", 8192, 3584)]


def _table(rate_tflops) -> pd.DataFrame:
    """A measured table of M = 1,024 on a 3 x 3 grid whose rate is rate_tflops(n, k)."""
    rows = [(1024, n, k, 2 * 1024 * n * k / (rate_tflops(n, k) * 1e12) * 1e3)  # latency in ms
            for n in (1024, 4096, 16384) for k in (1024, 4096, 16384)]
    return pd.DataFrame(rows, columns=["m", "n", "k", "latency"])


def test_the_layers_rate_is_its_flops_over_the_sum_of_its_gemms_times(script):
    flat = script.rate_grid(_table(lambda n, k: 800.0), 1024)
    layer, rates = script.layer_tflops(flat, [("a", 4096, 4096), ("b", 2000, 3000)])
    assert layer == pytest.approx(800.0) and rates == pytest.approx({"a": 800.0, "b": 800.0})
    # Twice as fast at the widest N: a GEMM there at 2x, one at the narrowest at 1x, weighted by FLOPs.
    wide = script.rate_grid(_table(lambda n, k: 1600.0 if n == 16384 else 800.0), 1024)
    layer, rates = script.layer_tflops(wide, [("wide", 16384, 4096), ("narrow", 1024, 4096)])
    flops = {"wide": 16384 * 4096, "narrow": 1024 * 4096}
    assert rates == pytest.approx({"wide": 1600.0, "narrow": 800.0})
    assert layer == pytest.approx(sum(flops.values()) / (flops["wide"] / 1600 + flops["narrow"] / 800))
    # Beyond the grid a shape reads its nearest edge; between points, between their rates.
    assert script.layer_tflops(wide, [("x", 65536, 65536)])[1]["x"] == pytest.approx(1600.0)
    assert 800.0 < script.layer_tflops(wide, [("y", 8192, 4096)])[1]["y"] < 1600.0
    assert script.rate_grid(_table(lambda n, k: 800.0), 2048) is None  # no GEMM of that M
