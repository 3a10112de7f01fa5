"""A weight GEMM's efficiency by its shape (compute/gemm_efficiency.py), the shipped table
(catalog/gemm_efficiency.csv) and the script that writes it (benchmarks/aiconfigurator_gemm_efficiency.py)."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmark_scripts import load_benchmark
from tokenpath.compute.chip import list_chips, load_chip
from tokenpath.compute.gemm_efficiency import ShapeCurve, ShapeTable, _tables, shape_table
from tokenpath.compute.model import load_model
from tokenpath.compute.roofline import ComputeModel

M_GRID = (256, 512, 1024, 2048, 4096, 8192, 16384)


@pytest.fixture
def script(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return load_benchmark("aiconfigurator_gemm_efficiency")


def test_the_shipped_tables_are_whole_grids_of_catalog_chips_and_the_engines_kernels():
    tables = _tables()
    assert {(chip, engine) for chip, engine, _ in tables} >= {("h100", "vllm"), ("h200", "sglang"), ("b200", "trtllm")}
    assert {chip for chip, _, _ in tables} <= set(list_chips())
    assert {engine for _, engine, _ in tables} == {"vllm", "sglang", "trtllm"}
    for key, table in tables.items():
        assert table.efficiency.shape == (len(M_GRID), 13, 13), key
        assert np.allclose(np.exp(table.log_m), M_GRID)
        assert np.all(np.diff(table.log_n) > 0) and np.all(np.diff(table.log_k) > 0)
        assert np.all((table.efficiency > 0) & (table.efficiency < 2.5)), key
    assert shape_table("mi300x", "vllm", "bf16") is None and shape_table("h100", "vllm", "fp4") is None


def test_a_tensor_parallel_split_slows_vllms_fp8_qkv_projection_on_h100():
    """Llama 3.1 70B's QKV projection, 10,240 outputs wide on one GPU and 1,280 on each of eight, over the
    hidden width: the measured table runs the narrow one at well under half the wide one's rate."""
    table = shape_table("h100", "vllm", "fp8")
    wide, narrow = table.curve(10240, 8192).at(2048), table.curve(1280, 8192).at(2048)
    assert 0.8 < wide < 1.1 and narrow < 0.5 * wide


def test_a_curve_holds_its_values_at_its_points_and_the_edges_beyond():
    curve = ShapeCurve(tuple(math.log(m) for m in (256, 1024, 4096)), (0.2, 0.6, 0.9))
    assert [curve.at(m) for m in (256, 1024, 4096)] == [0.2, 0.6, 0.9]
    assert curve.at(1) == curve.at(0) == 0.2 and curve.at(10**6) == 0.9
    assert curve.at(512) == pytest.approx(0.4)  # halfway in log M


@given(st.floats(0.5, 1e6), st.lists(st.floats(0.0, 2.0), min_size=7, max_size=7))
def test_a_curve_reads_what_np_interp_reads_in_log_m(m, values):
    curve = ShapeCurve(tuple(math.log(m) for m in M_GRID), tuple(values))
    assert curve.at(m) == float(np.interp(math.log(m), curve.log_m, curve.efficiency))


@given(st.floats(1.0, 1e6), st.floats(1.0, 1e6))
def test_a_curve_is_monotone_between_monotone_points(m1, m2):
    curve = ShapeCurve(tuple(math.log(m) for m in M_GRID), (0.1, 0.2, 0.35, 0.5, 0.7, 0.8, 0.85))
    low, high = sorted((m1, m2))
    assert 0.1 <= curve.at(low) <= curve.at(high) <= 0.85


def test_a_tables_curve_is_bilinear_in_log_n_and_log_k():
    logs = np.log(np.array([1024.0, 4096.0]))
    values = np.array([[[0.2, 0.4], [0.6, 1.0]]])  # one M; [n, k]
    table = ShapeTable(np.log(np.array([2048.0])), logs, logs, values)
    assert table.curve(1024, 1024).efficiency == (0.2,) and table.curve(4096, 4096).efficiency == (1.0,)
    assert table.curve(2048, 2048).efficiency == pytest.approx((0.55,))  # the mean of the corners
    assert table.curve(100, 10**6).efficiency == (0.4,)  # beyond the grid: its edge


def test_a_prompt_steps_gemms_run_at_their_shapes_efficiency_and_its_decode_barely_moves():
    """Llama 3.1 70B fp8 on H100 at TP8 under vLLM's kernels: each weight GEMM's compute time is its FLOPs
    at the chip's rate times its shape's efficiency at the step's tokens; the same model without a
    table (no engine named) runs them at the rate alone."""
    model, chip = load_model("llama-3.1-70b"), load_chip("h100")
    shaped = ComputeModel(model, chip, 8, "fp8", "bf16", gemm_kernels_of="vllm")
    plain = ComputeModel(model, chip, 8, "fp8", "bf16")
    qkv = next(op for op in shaped.ops if op.name == "qkv_proj")
    assert qkv.shape == (1280, 8192, "fp8")
    tokens = 2048
    efficiency = shape_table("h100", "vllm", "fp8").curve(1280, 8192).at(tokens)
    assert shaped._op_compute_s(qkv, tokens, 1, 0, 0) == pytest.approx(
        qkv.flops(tokens, 1, 0, 0) / (chip.effective_flops("fp8") * efficiency), rel=1e-12)
    prompt = (tokens, 1, tokens * (tokens + 1) / 2, tokens)
    assert shaped.step_time_s(*prompt) > 1.1 * plain.step_time_s(*prompt)
    decode = (8, 8, 8 * 2000, 8 * 2000)
    assert shaped.step_time_s(*decode) == pytest.approx(plain.step_time_s(*decode), rel=0.01)
    # step_time_s and the ops' costs agree, the shapes' efficiency in both
    ops_s = math.fsum(op.time_s for op in shaped.step_ops(*prompt))
    assert shaped.step_time_s(*prompt) == pytest.approx(ops_s + shaped.host_s(1), rel=1e-9)


def test_a_chip_without_a_measured_table_runs_its_gemms_at_its_rate():
    model, chip = load_model("llama-3.1-70b"), load_chip("mi300x")
    prompt = (2048, 1, 2048 * 2049 / 2, 2048)
    assert (ComputeModel(model, chip, 8, "bf16", "bf16", gemm_kernels_of="vllm").step_time_s(*prompt)
            == ComputeModel(model, chip, 8, "bf16", "bf16").step_time_s(*prompt))


def test_the_script_recovers_the_efficiency_the_model_times_a_gemm_with(script):
    """A synthetic table timed as the model times a GEMM (fixed time plus the p-norm of compute and
    memory) at a known rate per shape: the script reads back each shape's rate over the large GEMMs',
    and a memory-bound GEMM takes the efficiency of the next M up."""
    stream_Bps, fixed_s, reference = 3e12, 4e-6, 1000e12

    def rate(m, n, k):  # narrow GEMMs slower, the rest at the reference
        return reference * (0.5 if n < 4096 else 1.0)

    rows = []
    for m in (*M_GRID, 32768):
        for n in script.WIDTHS:
            for k in script.WIDTHS:
                compute_s = 2 * m * n * k / rate(m, n, k)
                memory_s = (n * k * 1 + (m * k + m * n) * 2) / stream_Bps
                rows.append((m, n, k, (fixed_s + math.hypot(compute_s, memory_s)) * 1e3))
    table = pd.DataFrame(rows, columns=["m", "n", "k", "latency"])
    found = script.efficiencies(table, "fp8", stream_Bps, fixed_s).set_index(["m", "n", "k"]).efficiency
    assert found.loc[4096, 8192, 8192] == pytest.approx(1.0)
    assert found.loc[4096, 1024, 8192] == pytest.approx(0.5)
    # M 256 of N 256 by K 256 streams far more than it multiplies: it takes the first M up that does not
    m, n, k = 256, 256, 256
    assert 2 * m * n * k / reference < (n * k + (m * k + m * n) * 2) / stream_Bps
    assert found.loc[m, n, k] == pytest.approx(0.5)
    assert len(found) == len(M_GRID) * len(script.WIDTHS) ** 2 and found.notna().all()
