"""Checks shared by the tests of per-request results and reports."""

import math

import numpy as np


def assert_means_match(frame, summary) -> None:
    """The per-request rows' means and p99 over the measured requests (ok, not warm-up) are the summary's,
    to float rounding (a CSV holds each float as its shortest decimal)."""
    kept = frame[frame["ok"].astype(bool) & ~frame["warmup"].astype(bool)]
    assert len(kept) == summary["requests"]["completed"]
    for key in ("ttft", "ttfv", "tpot", "e2e"):
        values = kept[f"{key}_s"].dropna().to_numpy(np.float64)
        assert math.isclose(values.mean(), summary["latency_s"][key]["mean"], rel_tol=1e-9), key
        assert math.isclose(np.percentile(values, 99), summary["latency_s"][key]["p99"], rel_tol=1e-9), key
    assert math.isclose(kept["output_tokens"].mean(), summary["requests"]["output_tokens_mean"], rel_tol=1e-9)
    if summary["attribution_s"] is not None:
        parts = summary["attribution_s"]
        for layer, mean_s in {**parts, **parts.get("delivery_detail", {})}.items():
            if layer != "delivery_detail":
                assert math.isclose(kept[f"{layer}_s"].mean(), mean_s, rel_tol=1e-9), layer
        parts = kept[["queue_s", "compute_s", "traffic_s", "delivery_s"]].sum(axis=1)
        assert np.allclose(parts, kept["e2e_s"], rtol=1e-9)  # the four layers add up to E2E, per request
    flow = summary.get("continuity")
    if flow is not None:  # the continuity block, from the same rows
        assert math.isclose(kept["stalls"].mean(), flow["stalls_per_request"], rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(kept["stall_s"].mean(), flow["stall_s_per_request"], rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(kept["qoe"].mean(), flow["qoe"]["mean"], rel_tol=1e-9)


def assert_five_layers_sum(run) -> None:
    """Each request's queue, compute, traffic, delivery and application time sum to its E2E exactly, each
    is non-negative, and the application's stages sum to its layer."""
    layers = (run.queue_ns, run.compute_ns, run.traffic_ns, run.delivery_ns, run.application_ns)
    assert np.array_equal(sum(layers), run.e2e_ns)
    assert np.array_equal(sum(run.application_detail_ns.values()), run.application_ns)
    assert all((part >= 0).all() for part in layers)
