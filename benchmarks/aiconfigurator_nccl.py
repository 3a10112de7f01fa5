"""The model's NCCL all-reduce on one NVLink domain, size by size, against AIConfigurator's measured tables.

`aiconfigurator-core` publishes NCCL's all-reduce latency measured on 2, 4 and 8 GPUs of each chip's
NVLink domain from 128 B to 1 GiB per rank (`systems/data/<chip>/comm/nccl/<version>/nccl_perf.parquet`,
fp16, sizes in elements). The project's collective rows (`validate --group nccl_allreduce`) are 3-4 GB
buffers; a serving step's all-reduces are 64 KB (a decode step) to a few hundred MB (a long prompt's
chunk), where the protocol NCCL runs and its latency set the time. This prints, for every chip, rank
count and size band, the median signed and absolute error of `fabric/collectives.py`'s time for the
same all-reduce (NCCL as the model runs it: `auto`, NVLS where the chip has it), the newest NCCL
version of each chip, and with `--rows` every size.

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_nccl.py [--data PATH/systems/data] [--rows]

Not a speed claim: it checks the collective model against published measurements.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

import pandas as pd
from aiconfigurator_stream_bw import CHIPS, default_data

from tokenpath.compute.chip import load_chip
from tokenpath.fabric.build import build_topology
from tokenpath.fabric.collectives import Collectives
from tokenpath.sim.deployment import chip_fabric

FP16_BYTES = 2
RANKS = (2, 4, 8)
# Decode steps, prompt chunks, then buffers larger than any step's.
BANDS_BYTES = ((2**16, 2**21, "64 KiB-2 MiB"), (2**21, 2**27, "2-128 MiB"), (2**27, 2**31, "128 MiB-2 GiB"))


def newest_table(folder: Path) -> Path | None:
    tables = sorted(folder.glob("comm/nccl/*/nccl_perf.parquet"),
                    key=lambda t: [int(x) for x in re.findall(r"\d+", t.parent.name)])
    return tables[-1] if tables else None


def measured_all_reduce(table: Path, ranks: int) -> pd.Series:
    """Seconds by bytes per rank of the table's fp16 all-reduces on `ranks` GPUs (median of repeats)."""
    df = pd.read_parquet(table)
    df = df[(df.op_name == "all_reduce") & (df.nccl_dtype == "half") & (df.num_gpus == ranks)]
    seconds = df.groupby("message_size").latency.median() * 1e-3  # the tables hold milliseconds
    seconds.index = seconds.index * FP16_BYTES
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    parser.add_argument("--rows", action="store_true", help="print every size")
    args = parser.parse_args()
    data = args.data or default_data()
    errors: dict[str, list[float]] = {label: [] for *_, label in BANDS_BYTES}
    for folder, chip_name in CHIPS.items():
        table = newest_table(data / folder)
        if table is None:
            continue
        chip = load_chip(chip_name)
        for ranks in RANKS:
            measured = measured_all_reduce(table, ranks)
            if measured.empty:
                continue
            # The chip's own domain, as a deployment of `ranks` chips builds it (sim/deployment.py).
            collectives = Collectives(build_topology(chip_fabric(chip, ranks)[0], chip.scaleup_bw_Bps, ranks))
            group = [list(range(ranks))]
            line = []
            for label_lo, label_hi, label in BANDS_BYTES:
                band = [(size, seconds, collectives.time_s("all_reduce", size, group))
                        for size, seconds in measured.items() if label_lo <= size < label_hi]
                signed = [model_s / seconds - 1 for _, seconds, model_s in band]
                errors[label] += signed
                line.append(f"{label} {statistics.median(signed):+.0%}")
                if args.rows:
                    for size, seconds, model_s in band:
                        print(f"    {size / 2**20:9.3f} MiB  measured {seconds * 1e6:8.1f} us  model "
                              f"{model_s * 1e6:8.1f} us ({collectives.choose('all_reduce', size, group)} "
                              f"{collectives.protocol('all_reduce', size, group)})  {model_s / seconds - 1:+.0%}")
            print(f"{chip_name:5s} NCCL {table.parent.name:7s} {ranks} GPUs: median signed error " + ", ".join(line))
    print("all chips and rank counts, median |error| (signed):")
    for label, signed in errors.items():
        if signed:
            print(f"  {label:14s} {statistics.median(abs(e) for e in signed):5.0%} ({statistics.median(signed):+.0%}) "
                  f"over {len(signed)} sizes")


if __name__ == "__main__":
    main()
