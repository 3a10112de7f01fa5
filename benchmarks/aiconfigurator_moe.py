"""How fast routed experts' grouped GEMMs run, against the dense rate, from AIConfigurator's MoE tables.

A mixture-of-experts layer runs its routed experts as grouped GEMMs: per expert, the tokens routed to
it times that expert's gate_up (hidden -> 2 w) and down (w -> hidden) weights, where w is the expert's
intermediate width on one chip (moe_intermediate_size / tp under tensor parallelism). `aiconfigurator-
core` publishes each serving engine's measured MoE latencies per chip (`systems/data/<chip>/moe/
<engine>/<version>/moe_perf.parquet`). For every run with one expert-parallel rank, uniform routing and
at least 256 tokens per expert (so that it is bound by its arithmetic, not by streaming the weights),
this takes the rate it reached, 2 x tokens x top-k x 3 x hidden x w / latency, as a fraction of the
chip's dense serving GEMM rate for that precision (what a dense GEMM runs at in tokenpath), and
prints the median fraction per width on the Hopper chips (H100, H200).

Two fits of fraction = ceiling x w / (w + w_half) follow, minimising the median |log error| over
the widths: bf16 and per-tensor fp8 weights with the ceiling held at 1 (wide experts reach the dense
rate), which sets efficiency.EXPERT_GEMM_HALF_WIDTH; then fp8 weights scaled per 128 x 128 block
(DeepSeek-V3's checkpoints) with that half-width, which sets
efficiency.BLOCK_SCALED_EXPERT_GEMM_CEILING.

As a check it repeats both fits per chip, B200 included, and on the three chips pooled. B200's runs
reach less of B200's dense rate than Hopper's of theirs (w_half 760 with the ceiling at 1, block
ceiling 0.39; pooled: 600 and 0.58), not more, so nothing in the tables makes Blackwell's grouped
GEMMs relatively faster; the constants stay the Hopper fit (docs/validation.md says why).

Last, the other end: a routed-expert layer for one token, which streams its top-k experts' weights and
little else. Per table (chip, engine and release, weight format) it prints the median time beyond
streaming those weights at the chip's measured_stream_bw, against the fixed time the model gives the
layer (its kernels at efficiency.KERNEL_FIXED_S each). A check of a part the model does not fit here
(docs/validation.md, "The routed experts' fixed time at decode sizes").

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_moe.py [--data PATH/systems/data]

Not a speed claim: it reproduces two constants of compute/efficiency.py from their source.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import pandas as pd
from aiconfigurator_stream_bw import default_data

from tokenpath.compute.chip import load_chip
from tokenpath.compute.efficiency import KERNEL_FIXED_S
from tokenpath.compute.ops import expert_layer_kernels
from tokenpath.compute.precision import stored_bytes

HOPPER = {"h100_sxm": "h100", "h200_sxm": "h200"}
CHECKED = {**HOPPER, "b200_sxm": "b200"}   # the per-chip check adds Blackwell
MIN_TOKENS_PER_EXPERT = 256    # compute-bound: each expert's GEMMs have M of at least this
PRECISIONS = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8"}


def fractions(data: Path, chips: dict[str, str] = HOPPER) -> pd.DataFrame:
    """One row per measured run on `chips` (AIConfigurator's folder: tokenpath's chip): its chip, its
    dtype, its per-chip expert width w and its rate / the dense rate."""
    rows = []
    for folder, chip_name in chips.items():
        chip = load_chip(chip_name)
        for table in sorted((data / folder / "moe").glob("*/*/moe_perf.parquet")):
            df = pd.read_parquet(table)
            df = df[(df.moe_ep_size == 1) & df.distribution.isin(["balanced", "uniform"])
                    & df.moe_dtype.isin(list(PRECISIONS))
                    & (df.num_tokens * df.topk / df.num_experts >= MIN_TOKENS_PER_EXPERT)]
            width = df.inter_size / df.moe_tp_size
            flops = 2 * df.num_tokens * df.topk * 3 * df.hidden_size * width
            # Newer tables hold Arrow strings, which map to strings: map plain objects.
            dtype = df.moe_dtype.astype(object)
            dense = dtype.map({name: chip.effective_flops(p) for name, p in PRECISIONS.items()}).astype(float)
            rows.append(pd.DataFrame({"chip": chip_name, "dtype": dtype, "width": width,
                                      "fraction": flops / (df.latency.astype(float) * 1e-3) / dense}))  # ms
    return pd.concat(rows)


def fit(medians: pd.Series, ceilings: list[float], half_widths: list[float]) -> tuple[float, float, float]:
    """(ceiling, w_half, median |log error|) of the best fit of ceiling x w / (w + w_half)."""
    return min(((c, w0, statistics.median(abs(math.log(c * w / (w + w0) / f)) for w, f in medians.items()))
                for c in ceilings for w0 in half_widths), key=lambda fit: fit[2])


def both_fits(runs: pd.DataFrame) -> tuple[float, float, float, float]:
    """(w_half, its error, block-scaled ceiling, its error) of `runs`, fitted as the constants are."""
    per_tensor = runs[runs.dtype != "fp8_block"].groupby("width").fraction.median()
    block = runs[runs.dtype == "fp8_block"].groupby("width").fraction.median()
    _, half_width, error = fit(per_tensor, [1.0], list(range(50, 3001, 10)))
    ceiling, _, block_error = fit(block, [c / 100 for c in range(10, 101)], [half_width])
    return half_width, error, ceiling, block_error


# Bytes a weight of each measured format takes, its scales included.
STORED_BYTES = {"bfloat16": stored_bytes("bf16"), "fp8": stored_bytes("fp8"), "fp8_block": stored_bytes("fp8"),
                "w4a16_mxfp4": stored_bytes("fp4", "mxfp4"), "nvfp4": stored_bytes("fp4", "nvfp4")}


def one_token_fixed_us(data: Path, chips: dict[str, str] = CHECKED) -> pd.DataFrame:
    """Per table (chip, engine/release, format): the median over its shapes of a one-token layer's
    latency less its top-k experts' weights streamed at the chip's measured bandwidth, in us; and the
    model's fixed time for such a layer (its expert op's kernels, compute/ops.py, at KERNEL_FIXED_S)."""
    rows = []
    for folder, chip_name in chips.items():
        stream_Bps = load_chip(chip_name).effective_hbm_bw_Bps
        for table in sorted((data / folder / "moe").glob("*/*/moe_perf.parquet")):
            df = pd.read_parquet(table)
            df = df[(df.num_tokens == 1) & (df.moe_ep_size == 1) & df.distribution.isin(["balanced", "uniform"])
                    & df.moe_dtype.isin(list(STORED_BYTES))]
            for dtype, runs in df.groupby(df.moe_dtype.astype(object)):
                weights = runs.topk * 3 * runs.hidden_size * runs.inter_size / runs.moe_tp_size * STORED_BYTES[dtype]
                beyond_us = (runs.latency.astype(float) * 1e-3 - weights / stream_Bps) * 1e6
                kernels = expert_layer_kernels(STORED_BYTES[dtype])
                rows.append({"chip": chip_name, "engine": "/".join(table.parts[-3:-1]), "format": dtype,
                             "shapes": len(runs), "beyond_us": statistics.median(beyond_us),
                             "model_us": kernels * KERNEL_FIXED_S * 1e6})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    data = parser.parse_args().data or default_data()
    checked = fractions(data, CHECKED)
    runs = checked[checked.chip.isin(list(HOPPER.values()))]
    per_tensor = runs[runs.dtype != "fp8_block"].groupby("width").fraction.median()
    block = runs[runs.dtype == "fp8_block"].groupby("width").fraction.median()
    print(f"{len(runs)} runs on H100 and H200; median fraction of the dense rate per expert width w:")
    for name, medians in (("bf16 / per-tensor fp8", per_tensor), ("fp8, 128 x 128 blocks", block)):
        shown = [w for w in medians.index if w in (64, 128, 256, 512, 1024, 2048, 4096, 7168)]
        print(f"  {name:22} " + "  ".join(f"w {w:g}: {medians[w]:.2f}" for w in shown))
    _, half_width, error = fit(per_tensor, [1.0], list(range(50, 3001, 10)))
    print(f"bf16 / per-tensor fp8, ceiling 1: w_half {half_width:.0f} (median |log error| {error:.2f})")
    ceiling, _, error = fit(block, [c / 100 for c in range(20, 101)], [half_width])
    print(f"fp8 in 128 x 128 blocks, w_half {half_width:.0f}: ceiling {ceiling:.2f} (median |log error| {error:.2f})")
    print("The same fits per chip (a check; the constants are the Hopper fit above):")
    groups = [(name, checked[checked.chip == name]) for name in CHECKED.values()] + [("all three", checked)]
    for name, group in groups:
        half_width, error, ceiling, block_error = both_fits(group)
        print(f"  {name:9} {len(group):6} runs: w_half {half_width:.0f} ({error:.2f}), block ceiling {ceiling:.2f} "
              f"({block_error:.2f})")
    print("A routed-expert layer for one token: median time beyond streaming its top-k experts' weights (us), "
          "against the model's fixed time for the layer:")
    for row in one_token_fixed_us(data).itertuples():
        print(f"  {row.chip:5} {row.engine:17} {row.format:12} {row.shapes:4} shapes: {row.beyond_us:6.1f}  "
              f"model {row.model_us:5.1f}")


if __name__ == "__main__":
    main()
