"""Whether the model ranks configurations as measured: for each load point at which a source measured
several configurations (TP sizes, engines, chips, models), Kendall's tau between the measured and the
predicted TTFT, and TPOT or ITL, and the pairs the prediction puts in the other order.

A choice between deployments needs the order right more than each figure: two configurations a
prediction misses by the same 15% still rank as measured. Every row of the group counts, calibration
rows too (their predictions are in-sample like the rest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations
from typing import Any

from tokenpath.validate.row_keys import label, lengths_label, load_label, load_point_key

Row = dict[str, Any]
# (metric name in the output, published key, predicted key)
METRICS = (("ttft", "ttft_ms", "predicted_ttft_ms"), ("decode", "decode_ms", "predicted_decode_ms"))


def kendall_tau(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """Kendall's tau-b of two rankings of the same items (scipy.stats.kendalltau); nan where either has
    every value the same."""
    from scipy.stats import kendalltau

    if len(set(measured)) < 2 or len(set(predicted)) < 2:
        return math.nan
    return float(kendalltau(measured, predicted).statistic)


def wrong_pairs(names: Sequence[str], measured: Sequence[float], predicted: Sequence[float]) -> list[list[str]]:
    """The pairs the prediction orders against the measurement, each as [measured lower, measured higher]
    (a pair tied in either is not wrong)."""
    wrong = []
    for i, j in combinations(range(len(names)), 2):
        if (measured[i] - measured[j]) * (predicted[i] - predicted[j]) < 0:
            low, high = (i, j) if measured[i] < measured[j] else (j, i)
            wrong.append([names[low], names[high]])
    return wrong


def _names(rows: Sequence[Row]) -> list[str]:
    """Each row's configuration; a row's index in the group where two would read the same."""
    names = [label(r) for r in rows]
    return [f"{name} #{k}" if names.count(name) > 1 else name for k, name in enumerate(names)]


def ranking(rows: Sequence[Row]) -> dict[str, Any]:
    """The ranking of the latency group's predicted rows (with `predicted_ttft_ms` and
    `predicted_decode_ms`): per load point with two or more rows, tau and the wrong pairs of each metric;
    overall, how many pairs each metric orders as measured."""
    grouped: dict[tuple, list[Row]] = {}
    for row in rows:
        grouped.setdefault(load_point_key(row), []).append(row)
    groups = []
    for members in (m for m in grouped.values() if len(m) >= 2):
        names = _names(members)
        entry: dict[str, Any] = {"source": members[0]["source"], "load": load_label(members[0]),
                                 "lengths": lengths_label(members[0]), "configurations": names}
        for metric, published, predicted in METRICS:
            measured_values = [r[published] for r in members]
            predicted_values = [r[predicted] for r in members]
            entry[metric] = {"tau": kendall_tau(measured_values, predicted_values),
                             "wrong": wrong_pairs(names, measured_values, predicted_values)}
        groups.append(entry)
    pairs = sum(len(g["configurations"]) * (len(g["configurations"]) - 1) // 2 for g in groups)
    return {"groups": groups, "pairs": pairs,
            **{f"{metric}_wrong": sum(len(g[metric]["wrong"]) for g in groups) for metric, _, _ in METRICS}}


def print_ranking(console: Any, document: dict[str, Any]) -> None:
    from rich.table import Table

    if not document["groups"]:
        return
    table = Table(title="Ranking: configurations a source measured at one load point, Kendall's tau of predicted "
                        "against measured, and the pairs predicted in the other order", title_justify="left")
    for column in ("source, load", "configurations", "TTFT tau", "TPOT / ITL tau", "out of order"):
        table.add_column(column, justify="right" if "tau" in column else "left")
    for g in document["groups"]:
        wrong = [f"{metric}: {low} < {high}" for metric, key in (("TTFT", "ttft"), ("TPOT/ITL", "decode"))
                 for low, high in g[key]["wrong"]]
        table.add_row(f"{g['source']}\n{g['lengths']}, {g['load']}", "\n".join(g["configurations"]),
                      f"{g['ttft']['tau']:+.2f}", f"{g['decode']['tau']:+.2f}",
                      "\n".join(wrong) if wrong else "none")
    console.print(table)
    pairs = document["pairs"]
    console.print(f"pairs in the measured order: TTFT {pairs - document['ttft_wrong']} of {pairs}, TPOT/ITL "
                  f"{pairs - document['decode_wrong']} of {pairs} (\"a < b\": a measured lower, predicted higher)\n")
