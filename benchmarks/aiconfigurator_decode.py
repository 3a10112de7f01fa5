"""A decode step's attention and tensor-parallel all-reduce, as the model costs them, against the serving
engines' measured kernels in AIConfigurator's tables.

`aiconfigurator-core` publishes, per chip and engine version, the measured latency of decode attention
(`systems/data/<chip>/attention/<engine>/<version>/generation_attention_perf.parquet`: batch size, heads,
KV heads, context) and of the engines' own all-reduce kernels (`comm/<engine>/<version>/
custom_allreduce_perf.parquet`, replayed in a CUDA graph as decode steps run them). This prints, per chip,
engine and tensor-parallel size, the median ratio of measured time to the model's time over Llama 3.1
70B's shapes (64 query heads and 8 KV heads of 128 split `tp` ways, a bf16 KV cache; batch 1 to 256,
contexts 512 to 8,192; all-reduces of 1 to 256 tokens of its 8,192-wide hidden state).

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_decode.py [--data PATH/systems/data]

Not a speed claim: a check of two of the step's parts against their measured kernels
(docs/validation.md, "Decode kernels").
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd
from aiconfigurator_stream_bw import CHIPS, default_data

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.compute.roofline import ComputeModel
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import load_scenario

MODEL = "llama-3.1-70b"
TP_SIZES = (2, 4, 8)
BATCHES = (1, 8, 32, 64, 128, 256)
CONTEXTS = (512, 1024, 2048, 4096, 8192)
ALL_REDUCE_TOKENS = (1, 8, 32, 64, 128, 256)


def attention_ratios(table: Path, compute: ComputeModel, tp: int) -> list[float]:
    """Measured / modelled decode attention per layer, over the grid's points the table holds."""
    model = compute.model
    df = pd.read_parquet(table)
    df = df[(df.num_heads == model.num_heads // tp) & (df.num_key_value_heads == model.num_kv_heads // tp)
            & (df.head_dim == model.head_dim) & (df.kv_cache_dtype == "bfloat16")]
    if "window_size" in df:  # older tables predate sliding windows
        df = df[df.window_size == 0]
    ratios = []
    for batch in BATCHES:
        for context in CONTEXTS:
            # The table's `step` is the context before the new token, less one (isl = 1).
            rows = df[(df.batch_size == batch) & (df.step == context - 1)]
            if rows.empty:
                continue
            ops = {op.name: op for op in compute.step_ops(batch, batch, batch * context, batch * context)}
            modelled_s = ops["attention"].time_s / model.num_layers
            ratios.append(rows.latency.min() * 1e-3 / modelled_s)  # the tables hold milliseconds
    return ratios


def all_reduce_ratios(table: Path, tp: int, hidden: int) -> list[float]:
    """Measured / modelled TP all-reduce of the decode step's hidden state, over ALL_REDUCE_TOKENS."""
    df = pd.read_parquet(table)
    df = df[~df.kernel_source.str.contains("eager")]   # the kernel replayed in a CUDA graph, as decode runs it
    df = df[df.num_gpus == tp].set_index("message_size").latency   # message_size counts bf16 elements
    deployment = build_deployment(load_scenario("typical", {"deployment.chips": tp, "deployment.tp": tp}))
    groups = deployment.placement.tp_groups()
    ratios = []
    for tokens in ALL_REDUCE_TOKENS:
        elements = tokens * hidden
        if elements in df.index:
            modelled_s = deployment.collectives.time_s("all_reduce", 2 * elements, groups)
            ratios.append(df[elements] * 1e-3 / modelled_s)
    return ratios


def summary(ratios: list[float]) -> str:
    if not ratios:
        return "no matching rows"
    return f"median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} points)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    data = parser.parse_args().data or default_data()
    model = load_model(MODEL)
    print(f"measured / modelled, {MODEL} decode shapes")
    for folder, chip_name in CHIPS.items():
        for tp in TP_SIZES:
            compute = ComputeModel(model, load_chip(chip_name), tp, "fp8", "bf16")
            for table in sorted((data / folder / "attention").glob("*/*/generation_attention_perf.parquet")):
                engine, version = table.parent.parent.name, table.parent.name
                print(f"{chip_name} tp{tp} attention  {engine} {version}: "
                      f"{summary(attention_ratios(table, compute, tp))}")
            if chip_name != "h200":
                continue  # the all-reduce's fabric: the default scenario's 8 x H200 NVLink domain
            for table in sorted((data / folder / "comm").glob("*/*/custom_allreduce_perf.parquet")):
                engine, version = table.parent.parent.name, table.parent.name
                print(f"{chip_name} tp{tp} all-reduce {engine} {version}: "
                      f"{summary(all_reduce_ratios(table, tp, model.hidden_size))}")


if __name__ == "__main__":
    main()
