"""`tokenpath validate --cross`: the fit procedures of the constants the latency rows set, and the
leave-one-source-out cross-validation built on them."""

import json
import math
import statistics
from dataclasses import replace

import pytest
import tomli_w

from cli_helpers import assert_user_error, run_cli
from tokenpath.config.assumptions import format_value, lookup
from tokenpath.config.errors import UserError
from tokenpath.sim.forked import available_cpus
from tokenpath.validate.cross import cross_validate, print_cross
from tokenpath.validate.fit import (
    PROCEDURES,
    Fit,
    Procedure,
    RowErrors,
    fit,
    fit_all,
    latency_predictor,
    mean_abs_log_error,
    median_abs_error,
)
from tokenpath.validate.latency import load_latency, predict_row, relative_errors, run_latency_group

# Two constants on a grid of powers of two around 1: a = 1/4 ... 8, b the same; the registry's value and the
# held-out fits' start both 1.
A = Procedure("a", "ttft", lambda row: "best_a" in row, lambda row: "best_a" in row, 0.25, 8.0, center=1.0, step=2.0,
              origin=1.0)
B = Procedure("b", "decode", lambda row: "best_b" in row, lambda row: "best_b" in row, 0.25, 8.0, center=1.0, step=2.0,
              origin=1.0)

# Source x's rows are right at a = 1/2, y's at a = 4 (and b = 2: only y informs b); z's one row is right
# at a = 2 and is a calibration row. A row that b does not inform has a fixed decode error.
ROWS = [
    {"source": "x", "best_a": 0.5, "decode": 0.1},
    {"source": "x", "best_a": 0.5, "decode": -0.3},
    {"source": "y", "best_a": 4.0, "best_b": 2.0},
    {"source": "y", "best_a": 4.0, "best_b": 2.0},
    {"source": "y", "best_a": 4.0, "best_b": 2.0},
    {"source": "z", "best_a": 2.0, "decode": 0.05, "calibration": True},
]


class FakePredictor:
    """Errors a hand can work out: a / best_a - 1, and b / best_b - 1 (or the row's fixed decode error);
    counts its calls by row and values."""

    def __init__(self):
        self.calls = []

    def __call__(self, row, values):
        self.calls.append((id(row), tuple(sorted(values.items()))))
        decode = values["b"] / row["best_b"] - 1 if "best_b" in row else row["decode"]
        return {"ttft": values["a"] / row["best_a"] - 1, "decode": decode}


def test_the_grid_runs_through_the_start_within_the_bounds():
    assert A.grid() == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
    assert A.grid(3.0) == [0.375, 0.75, 1.5, 3.0, 6.0]
    for procedure in PROCEDURES:
        # a fold's grid and start: the middle of the bounds, which no row sets (not a value frozen from a fit)
        assert procedure.held_out_start() == pytest.approx(math.sqrt(procedure.low * procedure.high), rel=1e-12)
        for grid, start in ((procedure.grid(), procedure.start()),
                            (procedure.grid(procedure.held_out_start()), procedure.held_out_start())):
            assert start in grid
            assert procedure.low <= grid[0] < procedure.low * procedure.step
            assert procedure.high / procedure.step < grid[-1] <= procedure.high
        assert procedure.start() == lookup(procedure.name).value


def test_each_source_is_predicted_with_values_fitted_on_the_others():
    document = cross_validate(RowErrors(ROWS, FakePredictor(), (A, B)), (A, B))
    folds = {fold["source"]: fold for fold in document["by_source"]}
    # x left out: a fitted on y's rows (z's row, at a = 2, is one against three), b on y's
    assert folds["x"]["fitted"] == {"a": 4.0, "b": 2.0} and folds["x"]["fitted_on"] == {"a": 4, "b": 3}
    # y left out: a fitted on x's rows and z's (a = 1/2 is right for two of three); no row informs b
    assert folds["y"]["fitted"] == {"a": 0.5, "b": 1.0} and folds["y"]["not_fitted"] == ["b"]
    assert folds["y"]["fitted_on"] == {"a": 3}
    assert folds["z"]["fitted"] == {"a": 4.0, "b": 2.0}
    # a and b do not interact: a second pass over each fold moves neither
    assert all((fold["passes"], fold["converged"]) == (2, True) for fold in folds.values())
    # on every row: a = 2 and a = 4 tie (median |error| 0.5: z's row right at 2, y's three at 4), the lower
    # of the two wins; b = 2, right for y's three rows
    assert document["all_rows"] == {"fitted": {"a": 2.0, "b": 2.0}, "registry": {"a": 1.0, "b": 1.0},
                                    "fitted_on": {"a": 6, "b": 3}, "passes": 2, "converged": True}
    # x: a = 4 against 1/2, +700%; decode errors as fixed
    assert (folds["x"]["rows"], folds["x"]["ttft_median"], folds["x"]["tpot_median"]) == (2, 7.0, 0.2)
    # y: a = 1/2 against 4, -87.5%; b = 1 against 2, -50%
    assert (folds["y"]["rows"], folds["y"]["ttft_median"], folds["y"]["tpot_median"]) == (3, 0.875, 0.5)
    assert (folds["z"]["rows"], folds["z"]["ttft_median"], folds["z"]["tpot_median"]) == (1, 1.0, 0.05)
    # every row out of its fold: |ttft| 7, 7, .875 x 3, 1 and |decode| .1, .3, .5 x 3, .05
    assert document["cross"] == {"ttft_median": (0.875 + 1.0) / 2, "tpot_median": (0.3 + 0.5) / 2}
    # in-sample: a = b = 1 (the registry's), the calibration row left out; beside it, the same five rows out of
    # their folds (|ttft| 7, 7, .875 x 3 and |decode| .1, .3, .5 x 3), the like-for-like comparison
    assert document["in_sample"] == {"ttft_median": 0.75, "tpot_median": 0.5, "rows": 5,
                                     "cross_on_these_rows": {"ttft_median": 0.875, "tpot_median": 0.5}}
    assert (document["rows"], document["sources"]) == (6, 3)


def test_no_fold_reads_the_registry_which_is_fitted_on_the_held_out_rows_too():
    """The registry's values are the fit on every row. A fold's grids and starting values run through each
    procedure's held_out_start instead, and a constant no other source informs stays there: with the
    registry at 3 rather than 1, the in-sample medians move and no fold does."""
    def document(registry):
        a, b = replace(A, center=registry), replace(B, center=registry)
        return cross_validate(RowErrors(ROWS, FakePredictor(), (a, b)), (a, b))

    at_one, at_three = document(1.0), document(3.0)
    assert at_three["by_source"] == at_one["by_source"] and at_three["cross"] == at_one["cross"]
    folds = {fold["source"]: fold for fold in at_three["by_source"]}
    # x left out: a on the grid through 1, where y's three rows are right at 4 (through 3, a = 3 would win:
    # 0.25 off on y's rows); y left out: b, which only y informs, at 1, not the registry's 3
    assert folds["x"]["fitted"] == {"a": 4.0, "b": 2.0}
    assert folds["y"]["fitted"]["b"] == 1.0 and folds["y"]["not_fitted"] == ["b"]
    # the registry's values, a = b = 3, scored in sample: |ttft| 5, 5, .25 x 3 and |decode| .1, .3, .5 x 3
    assert at_three["all_rows"]["registry"] == {"a": 3.0, "b": 3.0}
    assert at_three["in_sample"] == {"ttft_median": 0.25, "tpot_median": 0.5, "rows": 5,
                                     "cross_on_these_rows": {"ttft_median": 0.875, "tpot_median": 0.5}}
    assert at_three["in_sample"] != at_one["in_sample"]


def test_a_row_is_simulated_once_per_values_that_reach_it():
    predictor = FakePredictor()
    errors = RowErrors(ROWS, predictor, (A, B))
    cross_validate(errors, (A, B))
    assert len(predictor.calls) == len(set(predictor.calls)) == errors.simulated
    # x's rows are not reached by b: b's value never makes them simulated again
    x_calls = [values for row, values in predictor.calls if row == id(ROWS[0])]
    assert x_calls and all(dict(values).keys() == {"a"} for values in x_calls)


def test_constants_are_fitted_in_order_each_with_the_ones_before_at_their_fit():
    """b's rows here are right at b = 2a: fitted after a (a = 4 on y's rows), b is 8."""
    rows = [{"source": "y", "best_a": 4.0, "decode": 0.0, "best_b": "2a"}]

    def predict(row, values):
        return {"ttft": values["a"] / row["best_a"] - 1, "decode": values["b"] / (2 * values["a"]) - 1}

    reaches_both = replace(B, reaches=lambda row: True)
    fitted = fit_all([0], RowErrors(rows, predict, (A, reaches_both)), (A, reaches_both))
    assert fitted.values == {"a": 4.0, "b": 8.0} and fitted.fits["a"].rows == fitted.fits["b"].rows == 1
    assert (fitted.passes, fitted.converged) == (2, True)  # the second pass moved neither


def _coupled(target_a, target_b, start_a=1.0, start_b=1.0):
    """A row informing a and one informing b, each right at a value set by the other constant's (on the grid
    of powers of two); a and b start at `start_a` and `start_b`."""
    rows = [{"source": "x", "best_a": "b"}, {"source": "x", "best_b": "a"}]

    def predict(row, values):
        return {"ttft": values["a"] / target_a(values["b"]) - 1, "decode": values["b"] / target_b(values["a"]) - 1}

    a, b = replace(A, center=start_a, reaches=lambda row: True), replace(B, center=start_b, reaches=lambda row: True)
    return fit_all([0, 1], RowErrors(rows, predict, (a, b)), (a, b))


def test_the_fits_repeat_until_a_pass_moves_no_constant():
    """a is right at 2 where b >= 2 (else 1), b at 2 where a >= 2 (else 4). From a = b = 1, one pass gives
    a = 1, then b = 4; the next a = 2, b = 2; the third moves neither. From a = b = 4, one pass gives
    2, 2 and the second moves neither: the same values from either start, where one pass gave two."""
    def target_a(b):
        return 2.0 if b >= 2 else 1.0

    def target_b(a):
        return 2.0 if a >= 2 else 4.0

    from_one = _coupled(target_a, target_b)
    assert (from_one.values, from_one.passes, from_one.converged) == ({"a": 2.0, "b": 2.0}, 3, True)
    assert from_one.fits["a"].value == 2.0 and from_one.fits["a"].loss == 0.0
    from_four = _coupled(target_a, target_b, 4.0, 4.0)
    assert (from_four.values, from_four.passes, from_four.converged) == ({"a": 2.0, "b": 2.0}, 2, True)


def test_fits_that_cycle_stop_and_say_so():
    """a right at 4 / b and b right at a: from 1, 1 a pass gives 4, 4 and the next 1, 1 again."""
    cycling = _coupled(lambda b: 4.0 / b, lambda a: a)
    assert (cycling.values, cycling.passes, cycling.converged) == ({"a": 1.0, "b": 1.0}, 2, False)


def test_a_fold_whose_fits_cycle_is_named():
    from rich.console import Console

    rows = [{"source": "x", "best_a": 1.0, "decode": 0.0}, {"source": "y", "best_a": "b", "best_b": "a"},
            {"source": "y", "best_b": "a"}]

    # named after two of the registry's constants, for the tables' units
    a_name, b_name = "eager_host_per_kernel_s", "host_step_s"

    def predict(row, values):  # y's rows cycle as in test_fits_that_cycle_stop_and_say_so
        a, b = values[a_name], values[b_name]
        return {"ttft": a / (4.0 / b) - 1, "decode": b / a - 1}

    a = replace(A, name=a_name, informs=lambda row: row.get("best_a") == "b", reaches=lambda row: True)
    b = replace(B, name=b_name, informs=lambda row: row["source"] == "y", reaches=lambda row: True)
    document = cross_validate(RowErrors(rows, predict, (a, b)), (a, b))
    folds = {fold["source"]: fold for fold in document["by_source"]}
    assert (folds["x"]["passes"], folds["x"]["converged"]) == (2, False)
    assert folds["y"]["converged"] and folds["y"]["not_fitted"] == [a_name, b_name]
    console = Console(record=True, width=200)
    print_cross(console, document)
    text = console.export_text()
    assert "x left out: the fits did not settle in 2 passes (they cycle); its values are the last pass's" in text
    assert "y left out" not in text
    assert "On every row the fits did not settle in 2 passes" in text and "differ from the registry" not in text


def test_a_flat_objective_keeps_the_middle_of_the_grid_and_no_row_keeps_the_start():
    rows = [{"source": "x", "best_a": 1.0}]
    flat = replace(A, informs=lambda row: True)
    errors = RowErrors(rows, lambda row, values: {"ttft": 0.25, "decode": 0.0}, (flat,))
    assert fit(flat, [0], {"a": 1.0}, errors).value == 1.0
    assert fit(replace(A, informs=lambda row: False), [0], {"a": 1.0}, errors) is None


def test_the_losses_of_a_fit():
    assert median_abs_error([0.1, -0.5, 0.2]) == 0.2
    assert mean_abs_log_error([0.1, -0.5]) == pytest.approx((math.log(1.1) + math.log(2.0)) / 2)
    assert mean_abs_log_error([1.0]) == mean_abs_log_error([-0.5])  # twice and half as long alike


def test_a_procedure_fits_by_its_loss():
    # Two rows, right at a = 1/2 and at a = 4. Their median |relative error| is lowest at 1/2 (an 8x
    # under-prediction costs 87.5%, a 2x over-prediction 100%); the mean |log error| is the same from 1/2
    # to 4, and the middle of the tie wins.
    rows = [{"source": "x", "best_a": 0.5, "decode": 0.0}, {"source": "x", "best_a": 4.0, "decode": 0.0}]
    by_log = replace(A, loss=mean_abs_log_error)
    assert fit(A, [0, 1], {}, RowErrors(rows, FakePredictor(), (A,))).value == 0.5
    fitted = fit(by_log, [0, 1], {}, RowErrors(rows, FakePredictor(), (by_log,)))
    assert (fitted.value, fitted.loss) == (1.0, pytest.approx(math.log(8) / 2))


def test_a_row_that_cannot_be_predicted_is_named():
    def predict(row, values):
        raise UserError("its ITL needs every token's time")

    with pytest.raises(UserError, match=r"^latency rows\[2\] \(y\): its ITL needs"):
        RowErrors(ROWS, predict, (A, B)).get([(2, {"a": 1.0, "b": 1.0})])


def test_the_procedures_fit_the_rows_whose_metric_they_move():
    rows = load_latency()["rows"]
    informed = {p.name: {k for k, row in enumerate(rows) if p.informs(row)} for p in PROCEDURES}
    by_source = {p.name: {rows[k]["source"] for k in informed[p.name]} for p in PROCEDURES}
    v0 = {k for k, row in enumerate(rows) if row.get("engine_settings", {}).get("scheduler") == "vllm-v0"}
    multi_step = {k for k in v0 if rows[k]["engine_settings"].get("num_scheduler_steps", 1) > 1}
    # V0's part per scheduler call on its rows run one step at a time (vLLM CI's, and the pipeline-parallel
    # run vLLM 0.8.3 fell back to V0 for), its part every step on those run in windows of 10 steps (SGLang's
    # benchmark of vLLM 0.6.0); both reach every V0 row
    assert informed["vllm_v0_host_window_s"] == v0 - multi_step and by_source["vllm_v0_host_window_s"] == {
        "vllm_ci_h200", "azure_a100_vllm083"}
    assert informed["vllm_v0_host_step_s"] == multi_step and by_source["vllm_v0_host_step_s"] == {"sglang_vllm060"}
    assert len(v0) == 6 and len(multi_step) == 4
    for name in ("vllm_v0_host_window_s", "vllm_v0_host_step_s"):
        reaches = next(p for p in PROCEDURES if p.name == name).reaches
        assert {k for k, row in enumerate(rows) if reaches(row)} == v0
    # every SGLang and vLLM V0 row: their prompts run without a graph
    assert informed["eager_host_per_kernel_s"] == v0 | {k for k, row in enumerate(rows) if row["engine"] == "sglang"}
    # TensorRT-LLM's on its PyTorch backend's rows, not on NIM's TensorRT engine (eager_host = false)
    assert informed["trtllm_eager_host_per_kernel_s"] == {
        k for k, row in enumerate(rows) if row["engine"] == "trtllm" and row["source"] == "aiconfigurator_silicon"}
    assert len(informed["trtllm_eager_host_per_kernel_s"]) == 4
    assert all(rows[k]["engine_settings"]["eager_host"] is False for k, row in enumerate(rows)
               if row["source"] == "nim_h100")
    # vLLM V1 before its async scheduling, and the engines launched without host overlap (NIM's C++ executor,
    # SGLang v0.3) or that turn it off (SGLang 0.5.7 with its MTP drafter, as the row's [engine] resolves it)
    assert by_source["host_step_s"] == {"aiconfigurator_silicon", "nim_h100", "sglang_vllm060", "azure_a100_vllm083",
                                        "sgl_cookbook_mi300x"}
    assert not informed["host_step_s"] & v0
    for p in PROCEDURES:  # what a procedure fits on, it reaches
        assert all(p.reaches(rows[k]) for k in informed[p.name])


# The registry's values against the fit on every row, each constant alone (the others at the registry's
# values): vLLM V0's part per scheduler call, on its two rows, over its whole grid, where a window could
# stop at a local minimum next to the value. The others' grids are too long a test: host_step_s's over its
# 20 rows and V0's part every step's over its 4 multi-step runs are checked against their neighbours on
# the grid (their fits over the whole grid are the registry's 0.875 ms and 0.114 ms), as is
# trtllm_eager_host_per_kernel_s's over its 4 rows (76 us over the whole grid), and
# eager_host_per_kernel_s's fit over its 54 rows is the registry's 63.2 us (docs/validation.md,
# "Cross-validation of the latency rows").
REGISTRY_FITS = ["vllm_v0_host_window_s"]
NEIGHBOUR_FITS = ["host_step_s", "vllm_v0_host_step_s", "trtllm_eager_host_per_kernel_s"]


# Every procedure's constant at the registry's value, as `validate` runs the rows.
REGISTRY = {p.name: p.start() for p in PROCEDURES}


@pytest.fixture(scope="module")
def shipped_errors():
    data = load_latency()
    return RowErrors(data["rows"], latency_predictor(data["sharegpt"]), workers=min(2, available_cpus()))


def test_the_latency_groups_medians_stay_within_their_guard(shipped_errors):
    """The goal is 15% on each median, in sample: TPOT/ITL 9.0% and TTFT 17.6% over 69 rows (docs/validation.md;
    TTFT missed it from when the B200, MI300X and A100 40GB rows joined, at up to 23.0%, until the refit of
    2026-12-06, and again, at 15.9% from 13.8%, since SGLang's loop runs its finished sequences' batch, which
    took the cross-validated median from 17.6% to 16.5%, and at 17.6% since Azure's three other runs are rows,
    which had been left out for what the model misses on them). The TTFT guard is today's figure, not the goal,
    so that a change which moves it further is seen. Read from the registry's values on every row, which the
    fits below start from (what `validate --group latency` reports:
    test_the_json_document_gives_errors_as_fractions_and_each_folds_values)."""
    rows = shipped_errors.rows
    errors = shipped_errors.get([(k, REGISTRY) for k in range(len(rows))])
    scored = [e for row, e in zip(rows, errors) if not row.get("calibration")]
    assert len(rows) - len(scored) == 4 and len(scored) >= 60
    assert median_abs_error([e["ttft"] for e in scored]) <= 0.18
    assert median_abs_error([e["decode"] for e in scored]) <= 0.15


@pytest.mark.parametrize("name", REGISTRY_FITS)
def test_the_registrys_value_is_the_fit_on_every_row(name, shipped_errors):
    procedure = next(p for p in PROCEDURES if p.name == name)
    start = procedure.start()
    fitted = fit(procedure, range(len(shipped_errors.rows)), REGISTRY, shipped_errors)
    # within one step of the grid, the fit's resolution
    assert abs(math.log(fitted.value / start)) <= math.log(procedure.step) + 1e-9, (name, fitted.value, start)


@pytest.mark.parametrize("name", NEIGHBOUR_FITS)
def test_the_registrys_value_is_the_fit_on_every_row_against_its_neighbours(name, shipped_errors):
    procedure = next(p for p in PROCEDURES if p.name == name)
    start = procedure.start()
    # its neighbours on the grid, within the procedure's bounds (vLLM V0's step part sits one step above its
    # lowest, 0.1 ms: the fit would go lower)
    nearby = replace(procedure, low=max(start / procedure.step * 0.99, procedure.low),
                     high=min(start * procedure.step * 1.01, procedure.high))
    assert len(nearby.grid()) >= 2
    assert fit(nearby, range(len(shipped_errors.rows)), REGISTRY, shipped_errors).value == start


def _rows_file(tmp_path):
    """Two sources of one small vLLM V1 run each, which host_step_s alone reaches: 8 requests (2 a slot,
    not the source's 20), as many as the document's folds and medians need, so that each of the fits' ~110
    simulations is short."""
    row = next(r for r in load_latency()["rows"] if r.get("id", "").endswith("1024x1024_c4_tp8_ep1_725"))
    row = {**row, "requests_per_slot": 2}
    rows = [{**row, "source": "lab_a"}, {**row, "source": "lab_b", "decode_ms": row["decode_ms"] * 1.25}]
    path = tmp_path / "rows.toml"
    path.write_text(tomli_w.dumps({"rows": rows}))
    return str(path)


def test_the_json_document_gives_errors_as_fractions_and_each_folds_values(tmp_path, monkeypatch, capsys):
    """The document records the constants published groups fit (test_simulate.py checks the fits
    themselves): here they are the registry's, without the offline group's minutes of simulation."""
    from tokenpath.validate import groups

    fits = {"eager_kernel_launch_s": "trtllm_batch1_ttft", "serving_gemm_fraction": "trtllm_offline"}
    rows = {"trtllm_batch1_ttft": 4, "trtllm_offline": 28}
    monkeypatch.setattr(groups, "fit_group_constants", lambda: {
        name: (group, Fit(name, lookup(name).value, rows[group], 0.0)) for name, group in fits.items()})
    path, written = _rows_file(tmp_path), tmp_path / "cross.json"
    code, out, err = run_cli(["validate", "--cross", "--latency-rows", path, "--json", str(written)], monkeypatch,
                             capsys)
    assert code == 0, err
    # the tables: each fold, its values (those no other source informs at the middle of their bounds: "no
    # row"), the fit on every row (the registry's where no row informs one) and both medians
    assert "lab_a" in out and "lab_b" in out and "no row" in out and "registry" in out
    assert "cross-validated" in out and "in-sample" in out
    document = json.loads(written.read_text())
    assert set(document) == {"rows", "sources", "cross", "in_sample", "all_rows", "by_source", "row_errors",
                             "fitted_elsewhere"}
    assert (document["rows"], document["sources"]) == (2, 2)
    # the launch gap and the GEMMs' serving fraction, fitted on published rows of other sources, in every fold
    assert document["fitted_elsewhere"] == {
        "eager_kernel_launch_s": {"value": pytest.approx(lookup("eager_kernel_launch_s").value, rel=1e-9),
                                  "group": "trtllm_batch1_ttft", "rows": 4},
        "serving_gemm_fraction": {"value": pytest.approx(lookup("serving_gemm_fraction").value, rel=1e-9),
                                  "group": "trtllm_offline", "rows": 28}}
    assert "eager_kernel_launch_s: 3.71 us in every fold" in out
    data = load_latency(path)
    names = [p.name for p in PROCEDURES]
    out_of_fold = []
    for fold, held_out in zip(document["by_source"], data["rows"]):
        assert fold["source"] == held_out["source"] and fold["rows"] == 1
        assert list(fold["fitted"]) == names and fold["fitted_on"] == {"host_step_s": 1}
        assert fold["converged"] and fold["passes"] == 2  # host_step_s moved, then stayed
        assert fold["not_fitted"] == ["eager_host_per_kernel_s", "trtllm_eager_host_per_kernel_s",
                                      "vllm_v0_host_window_s", "vllm_v0_host_step_s"]
        assert all(fold["fitted"][n] == next(p for p in PROCEDURES if p.name == n).held_out_start()
                   for n in fold["not_fitted"])
        assert fold["fitted"]["vllm_v0_host_step_s"] == pytest.approx(1e-3, rel=1e-12)  # 0.1-10 ms
        # the held-out row is predicted with the values fitted on the other source
        errors = relative_errors(held_out, predict_row(held_out, data["sharegpt"], fold["fitted"]))
        assert (fold["ttft_median"], fold["tpot_median"]) == (abs(errors["ttft"]), abs(errors["decode"]))
        out_of_fold.append(errors)
    # lab_b's TPOT is 25% slower than lab_a's: each fold's host step is fitted to the other source's
    assert document["by_source"][0]["fitted"]["host_step_s"] > document["by_source"][1]["fitted"]["host_step_s"]
    # on both rows it is neither's, nor the registry's, and the table says so
    every = document["all_rows"]
    assert every["fitted_on"] == {"host_step_s": 2} and every["registry"]["host_step_s"] == lookup("host_step_s").value
    assert every["fitted"]["host_step_s"] != every["registry"]["host_step_s"]
    fitted = format_value("host_step_s", every["fitted"]["host_step_s"])
    assert (f"Fitted on every row, these differ from the registry: host_step_s {fitted} (registry 875 us); "
            "config/assumptions.py holds the registry") in " ".join(out.split())
    assert document["cross"] == {"ttft_median": statistics.median(abs(e["ttft"]) for e in out_of_fold),
                                 "tpot_median": statistics.median(abs(e["decode"]) for e in out_of_fold)}
    assert document["row_errors"] == out_of_fold  # each row's, in the rows' order (the bands file's errors)
    # in-sample: what `validate --group latency` reports, as fractions
    summary = run_latency_group(data)["summary"]
    assert document["in_sample"] == {"ttft_median": summary["median_abs_error_ttft"],
                                     "tpot_median": summary["median_abs_error_decode"], "rows": 2,
                                     "cross_on_these_rows": document["cross"]}  # (no calibration row among them)
    assert 0 < document["cross"]["tpot_median"] < 1


def test_cross_takes_the_latency_group_only(monkeypatch, capsys):
    assert_user_error(*run_cli(["validate", "--cross", "--group", "nccl_allreduce"], monkeypatch, capsys),
                      "--cross", "latency")
