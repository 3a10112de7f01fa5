"""Tables of the embedded model and chip catalogs."""

from __future__ import annotations

from rich.table import Table

from tokenpath.compute.chip import list_chips, load_chip
from tokenpath.compute.model import list_models, load_model
from tokenpath.config.units import format_bandwidth, format_bytes
from tokenpath.report.table import catalog_table


def models_table() -> Table:
    rows = []
    for name in list_models():
        m = load_model(name)
        kind = "MoE" if m.is_moe else "dense"
        attention = "MLA" if m.is_mla else ("GQA" if m.num_kv_heads < m.num_heads else "MHA")
        if m.sliding_layers:
            attention += f"+SWA {m.sliding_window}"
        rows.append([
            name, f"{m.params_total() / 1e9:.1f} B", f"{m.params_active_per_token() / 1e9:.1f} B", kind, attention,
            str(m.num_layers), str(m.hidden_size), f"{m.max_context:,}",
        ])
    return catalog_table("Models",
                         ["name", "params", "active", "kind", "attention", "layers", "hidden", "context"], rows)


def chips_table() -> Table:
    rows = []
    for name in list_chips():
        c = load_chip(name)
        flops = ", ".join(f"{p} {v / 1e12:,.0f}" for p, v in c.peak_flops.items())
        nic = format_bandwidth(c.nic_bw_Bps) if c.nic_bw_Bps else "-"
        rows.append([name, flops, ", ".join(c.weight_only) or "-", format_bytes(c.hbm_bytes),
                     format_bandwidth(c.hbm_bw_Bps), format_bandwidth(c.effective_hbm_bw_Bps),
                     f"{format_bandwidth(c.scaleup_bw_Bps)} x {c.scaleup_domain:,}", nic])
    return catalog_table("Chips (dense peak TFLOP/s; weight-only precisions multiply at bf16; streamed: the HBM "
                         "bandwidth memory-bound kernels run at, measured where published; scale-up per direction x "
                         "chips in its domain; NIC per direction)",
                         ["name", "TFLOP/s", "weight-only", "HBM", "HBM bandwidth", "streamed", "scale-up", "NIC"],
                         rows)
