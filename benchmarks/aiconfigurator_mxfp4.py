"""How long MXFP4 routed experts take where a chip has no FP4 tensor cores, per serving engine, from
AIConfigurator's measured MoE tables: engine/expert_kernels.py's three figures.

On Hopper the engines run an MXFP4 checkpoint's experts weight-only (`w4a16_mxfp4` in `aiconfigurator-
core`'s `systems/data/<chip>/moe/<engine>/<version>/moe_perf.parquet`): the weights are dequantized to
bf16 inside the GEMM. For every such run of gpt-oss-120b's expert shape (hidden 2880, 128 experts, top 4,
uniform routing, one expert-parallel rank) on H100 and H200 at each tensor-parallel size of one node
(1 to 8), this takes the measured time of a layer's routed experts less the fixed time the model gives
their kernels, over the model's roofline time for them (compute/roofline.py, the experts' op at their
weight-only precision):
the multiple the model's roofline is short by. Per engine it prints that multiple's median over 8 to
1,024 tokens (the decode batches of serving) for each table, and the median over the tables: the figure
the registry keeps. The same on B200 (native FP4: `w4a8_mxfp4_mxfp8`, what the engines serve there) is a
check, not applied.

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_mxfp4.py [--data PATH/systems/data]

Not a speed claim: it reproduces three registry figures from their source.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd
from aiconfigurator_stream_bw import default_data

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.compute.roofline import ComputeModel, op_time_s

SHAPE = {"hidden_size": 2880, "inter_size": 2880, "num_experts": 128, "topk": 4}  # gpt-oss-120b's experts
DECODE_TOKENS = (8, 16, 32, 64, 128, 256, 512, 1024)
TP_SIZES = (1, 2, 4, 8)  # the tensor-parallel sizes of one 8-GPU node (the tables go to 32)
APPLIED = {"h100_sxm": "h100", "h200_sxm": "h200"}
CHECKED = {"b200_sxm": "b200"}
DTYPES = {"h100_sxm": "w4a16_mxfp4", "h200_sxm": "w4a16_mxfp4", "b200_sxm": "w4a8_mxfp4_mxfp8"}


def multiples(data: Path, chips: dict[str, str]) -> pd.DataFrame:
    """Per table (chip, tp, engine, release): the median over DECODE_TOKENS of (measured - the model's
    fixed time) / the model's roofline time, for a layer's routed experts."""
    model = load_model("gpt-oss-120b")
    rows = []
    for folder, chip in chips.items():
        for path in sorted((data / folder / "moe").glob("*/*/moe_perf.parquet")):
            engine, release = path.parts[-3], path.parts[-2]
            table = pd.read_parquet(path)
            table = table[(table.moe_dtype == DTYPES[folder]) & (table.moe_ep_size == 1)
                          & (table.distribution == "balanced")
                          & (table[list(SHAPE)] == pd.Series(SHAPE)).all(axis=1)]
            for tp, runs in table[table.moe_tp_size.isin(TP_SIZES)].groupby("moe_tp_size"):
                compute = ComputeModel(model, load_chip(chip), int(tp), "bf16", "bf16", expert_precision="fp4")
                experts = [op for op in compute.ops if op.name == "moe_experts"]
                bandwidth = compute.chip.effective_hbm_bw_Bps
                measured_s = runs.groupby("num_tokens").latency.median() * 1e-3
                found = []
                for tokens in DECODE_TOKENS:
                    if tokens not in measured_s.index:
                        continue
                    touched = compute.experts_touched(tokens)
                    roofline_s = sum(op_time_s(op.compute_s(tokens, 0, 0, 0),
                                               op.bytes(tokens, 0, 0, touched) / bandwidth, op.gemm,
                                               compute.gemm_overlap_norm) for op in experts) / model.moe_layers
                    fixed_s = sum(compute.fixed_s(op) for op in experts) / model.moe_layers
                    found.append((measured_s[tokens] - fixed_s) / roofline_s)
                if found:
                    rows.append({"chip": chip, "tp": int(tp), "engine": engine, "release": release,
                                 "multiple": statistics.median(found)})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    data = parser.parse_args().data or default_data()
    for title, chips in (("applied: Hopper, weight-only (w4a16_mxfp4)", APPLIED),
                         ("check: B200, native (w4a8_mxfp4_mxfp8)", CHECKED)):
        table = multiples(data, chips)
        print(title)
        if table.empty:
            print("  no table")
            continue
        for engine, runs in table.groupby("engine"):
            each = ", ".join(f"{r.chip} tp{r.tp} {r.release} {r.multiple:.2f}" for r in runs.itertuples())
            print(f"  {engine}: median {runs.multiple.median():.2f} over {len(runs)} tables ({each})")


if __name__ == "__main__":
    main()
