"""An accelerator's compute and memory figures, from the embedded catalog (catalog/chips.toml)."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from tokenpath import catalog
from tokenpath.compute.precision import FP4_SCALE_BLOCKS, PRECISION_BYTES
from tokenpath.config.assumptions import DEFAULTS, Assumptions
from tokenpath.config.errors import UserError
from tokenpath.config.units import parse_bandwidth_Bps, parse_bytes, parse_duration_s

_FALLBACK_PRECISION = "bf16"


@dataclass(frozen=True)
class ChipSpec:
    """One chip. `peak_flops` is dense FLOP/s per precision; `matmul_efficiency` the fraction of it a
    large GEMM reaches (measured where published, else efficiency.DEFAULT_MATMUL_EFFICIENCY);
    `scaleup_bw_Bps` is per direction. `measured_scaleup_bw_Bps` is 0.0 where none is published.
    `hbm_bw_efficiency` is the fraction of `hbm_bw_Bps` a memory-bound kernel sustains: the catalog's
    measured_stream_bw over hbm_bw where published, else efficiency.HBM_BW_EFFICIENCY (an override of
    the hbm_bw_efficiency assumption replaces either). `gemm_fixed_s` is the fixed time of a GEMM by
    weights on top of its work: the catalog's measured_gemm_fixed where published, else
    efficiency.GEMM_FIXED_S (an override of the gemm_fixed_s assumption replaces either). `kernel_fixed_s`
    is the fixed time of any other kernel: the catalog's measured_kernel_fixed where published, else
    efficiency.KERNEL_FIXED_S (an override of the kernel_fixed_s assumption replaces either); a chip
    that publishes it and no measured_gemm_fixed gives a GEMM at least the measured time too (a GEMM is a
    kernel), an override of kernel_fixed_s or not (a calibration fitting it moves the other kernels).
    `weight_only` lists the precisions it has no tensor cores for but serving engines run as
    weight-only quantization (weights stored at that precision, multiplied at bf16).
    `scaleup_domain` is how many chips one scale-up fabric joins (an NVLink domain), `scaleup` that
    fabric's table without its size, `nic_bw_Bps` each chip's scale-out NIC (0.0: none in the
    catalog). `chips_per_host` is how many one machine holds (the catalog's, else `scaleup_domain`).
    `generation` is the architecture the vendor names (Ampere, Hopper, CDNA3, ...); `vendor` the maker
    (one of VENDORS), which decides the engines and images `tokenpath launch` writes for it.
    `fp4_format` is the block-scaled fp4 format its engines store fp4 weights in where the checkpoint
    does not choose (precision.FP4_SCALE_BLOCKS): NVIDIA's NVFP4, AMD's MXFP4."""

    name: str
    peak_flops: dict[str, float]
    hbm_bytes: float
    hbm_bw_Bps: float
    scaleup_bw_Bps: float
    matmul_efficiency: dict[str, float]
    hbm_bw_efficiency: float
    gemm_fixed_s: float
    kernel_fixed_s: float
    source: str
    measured_scaleup_bw_Bps: float = 0.0
    host_link: str = ""
    weight_only: tuple[str, ...] = ()
    scaleup_domain: int = 8
    chips_per_host: int = 8
    scaleup: dict = dataclasses.field(default_factory=lambda: {"kind": "switch"})
    nic_bw_Bps: float = 0.0
    generation: str = ""
    fp4_format: str = "nvfp4"
    vendor: str = "nvidia"
    # The registry assumptions whose values above are this chip's catalog measurements (an override of
    # one replaces its measurement, and it is not listed).
    measured: tuple[str, ...] = ()
    # The share of the large-GEMM ceiling the serving steps' weight GEMMs reach, which `matmul_efficiency`
    # holds (the serving_gemm_fraction assumption; 1.0: the ceiling itself).
    serving_gemm_fraction: float = 1.0

    def compute_precision(self, precision: str) -> str:
        """The tensor-core precision that multiplies operands stored at `precision`.

        fp16 runs at the bf16 rate; a weight-only precision (fp8 on A100, fp4 on H100) is up-converted
        and multiplied at bf16, as vLLM's Marlin kernels do; any other is an error naming what the
        chip runs.
        """
        if precision in self.peak_flops:
            return precision
        if precision == "fp16" or precision in self.weight_only:
            return _FALLBACK_PRECISION
        # (what a scenario's precision may name: fp16 weights, which run at the bf16 rate, are stated as bf16)
        native = [p for p in self.peak_flops if p != "fp16"]
        runs = ", ".join([*native, *(f"{p} (weight-only)" for p in self.weight_only)])
        raise UserError(f"model.precision: {precision} does not run on {self.name} (deployment.chip): it has no "
                        f"{precision} tensor cores and no weight-only {precision} kernel is known for it; use one it "
                        f"runs: {runs}")

    def is_weight_only(self, precision: str) -> bool:
        """Whether weights stored at `precision` are multiplied at bf16 on this chip."""
        return precision in self.weight_only and precision not in self.peak_flops

    def effective_flops(self, precision: str) -> float:
        """Sustained GEMM FLOP/s for operands at `precision`: peak x matmul efficiency."""
        used = self.compute_precision(precision)
        return self.peak_flops[used] * self.matmul_efficiency[used]

    def ceiling_flops(self, precision: str) -> float:
        """The large-GEMM ceiling for operands at `precision` (the measured MAMF, or the default efficiency's
        share of peak): effective_flops without the serving fraction."""
        return self.effective_flops(precision) / self.serving_gemm_fraction

    @property
    def effective_hbm_bw_Bps(self) -> float:
        return self.hbm_bw_Bps * self.hbm_bw_efficiency

    def measured_assumptions(self) -> dict[str, float]:
        """The registry assumptions this chip holds its own measured values of (`measured`): a run on it
        uses these, not the registry's."""
        return {name: getattr(self, name) for name in self.measured}


VENDORS = ("nvidia", "amd", "google", "intel")
_REQUIRED = ("source", "generation", "vendor", "peak_tflops", "hbm", "hbm_bw", "scaleup_bw", "scaleup_domain")
_OPTIONAL = ("aliases", "chips_per_host", "measured_matmul_tflops", "measured_scaleup_bw", "measured_stream_bw",
             "measured_gemm_fixed", "measured_kernel_fixed", "host_link", "weight_only", "scaleup", "nic_bw",
             "fp4_format")


def list_chips() -> list[str]:
    """Canonical names of the catalog's chips, in catalog order."""
    return catalog.entry_names(catalog.CHIPS_FILE)


def load_chip(name: str, assumptions: Assumptions = DEFAULTS) -> ChipSpec:
    """A catalog chip by name or alias ('h200', 'H200_SXM', 'tpu-v5p'), its efficiencies under
    `assumptions` (a run's; the registry's by default)."""
    canonical, table = catalog.lookup(catalog.CHIPS_FILE, name, "chip", "chips")
    where = f"catalog chips.toml [{canonical}]"
    missing = [key for key in _REQUIRED if key not in table]
    if missing:
        raise UserError(f"{where}: missing required key {missing[0]!r}")
    unknown = sorted(set(table) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; use one of {', '.join(_REQUIRED + _OPTIONAL)}")
    peak_flops = _tflops(table["peak_tflops"], f"{where} peak_tflops")
    if _FALLBACK_PRECISION not in peak_flops:
        raise UserError(f"{where} peak_tflops: needs a {_FALLBACK_PRECISION} entry")
    measured = _tflops(table.get("measured_matmul_tflops", {}), f"{where} measured_matmul_tflops")
    for precision, rate in measured.items():
        if precision not in peak_flops:
            raise UserError(f"{where} measured_matmul_tflops.{precision}: the chip has no {precision} peak_tflops; "
                            f"give rates for its peak precisions ({', '.join(peak_flops)})")
        if not 0 < rate <= peak_flops[precision]:
            raise UserError(f"{where} measured_matmul_tflops.{precision}: must be positive and at most "
                            f"the peak ({peak_flops[precision] / 1e12:g})")
    # A precision no source measures on this chip runs at the efficiency measured at its others (the
    # median), the chip's own evidence before other chips'; a chip measured at none, at the default.
    own = [rate / peak_flops[precision] for precision, rate in measured.items()]
    unmeasured = statistics.median(own) if own else assumptions.value("default_matmul_efficiency")
    gemm_fraction = assumptions.value("serving_gemm_fraction")
    matmul_efficiency = {p: gemm_fraction * (measured[p] / peak if p in measured else unmeasured)
                         for p, peak in peak_flops.items()}
    measured_scaleup = table.get("measured_scaleup_bw")
    hbm_bw_Bps = parse_bandwidth_Bps(table["hbm_bw"], f"{where} hbm_bw")
    hbm_bw_efficiency = assumptions.value("hbm_bw_efficiency")
    measured_here = []
    if "measured_stream_bw" in table:
        stream_Bps = parse_bandwidth_Bps(table["measured_stream_bw"], f"{where} measured_stream_bw")
        if not 0 < stream_Bps <= hbm_bw_Bps:
            raise UserError(f"{where} measured_stream_bw: must be positive and at most hbm_bw "
                            f"({table['hbm_bw']}); got {table['measured_stream_bw']!r}")
        if "hbm_bw_efficiency" not in assumptions.values:  # an override replaces the measured figure too
            hbm_bw_efficiency = stream_Bps / hbm_bw_Bps
            measured_here.append("hbm_bw_efficiency")
    gemm_fixed_s = assumptions.value("gemm_fixed_s")
    if "measured_gemm_fixed" in table and "gemm_fixed_s" not in assumptions.values:
        gemm_fixed_s = parse_duration_s(table["measured_gemm_fixed"], f"{where} measured_gemm_fixed")
        measured_here.append("gemm_fixed_s")
    kernel_fixed_s = assumptions.value("kernel_fixed_s")
    if "measured_kernel_fixed" in table:
        measured_kernel_s = parse_duration_s(table["measured_kernel_fixed"], f"{where} measured_kernel_fixed")
        if "kernel_fixed_s" not in assumptions.values:
            kernel_fixed_s = measured_kernel_s
            measured_here.append("kernel_fixed_s")
        if "measured_gemm_fixed" not in table and "gemm_fixed_s" not in assumptions.values:
            gemm_fixed_s = max(gemm_fixed_s, measured_kernel_s)  # a GEMM is a kernel: the chip's floor
    weight_only = table.get("weight_only", [])
    if not isinstance(weight_only, list) or any(p not in PRECISION_BYTES or p in peak_flops for p in weight_only):
        raise UserError(f"{where} weight_only: list precisions it has no peak_tflops for, from "
                        f"{', '.join(PRECISION_BYTES)}; got {weight_only!r}")
    fp4_format = table.get("fp4_format", "nvfp4")
    if fp4_format not in FP4_SCALE_BLOCKS:
        raise UserError(f"{where} fp4_format: one of {', '.join(FP4_SCALE_BLOCKS)}; got {fp4_format!r}")
    if table["vendor"] not in VENDORS:
        raise UserError(f"{where} vendor: one of {', '.join(VENDORS)}; got {table['vendor']!r}")
    domain = table["scaleup_domain"]
    if isinstance(domain, bool) or not isinstance(domain, int) or domain < 1:
        raise UserError(f"{where} scaleup_domain: the chips one scale-up fabric joins, a whole number >= 1; "
                        f"got {domain!r}")
    per_host = table.get("chips_per_host", domain)
    if isinstance(per_host, bool) or not isinstance(per_host, int) or per_host < 1:
        raise UserError(f"{where} chips_per_host: the chips one machine holds, a whole number >= 1; got {per_host!r}")
    scaleup = table.get("scaleup", {"kind": "switch"})
    if not isinstance(scaleup, dict) or "hosts" in scaleup:
        raise UserError(f"{where} scaleup: a fabric table without hosts (scaleup_domain sizes it), "
                        f"e.g. {{ kind = \"switch\" }}; got {scaleup!r}")
    return ChipSpec(
        name=canonical,
        peak_flops=peak_flops,
        hbm_bytes=parse_bytes(table["hbm"], f"{where} hbm"),
        hbm_bw_Bps=hbm_bw_Bps,
        scaleup_bw_Bps=parse_bandwidth_Bps(table["scaleup_bw"], f"{where} scaleup_bw"),
        matmul_efficiency=matmul_efficiency,
        hbm_bw_efficiency=hbm_bw_efficiency,
        gemm_fixed_s=gemm_fixed_s,
        kernel_fixed_s=kernel_fixed_s,
        source=str(table["source"]),
        measured_scaleup_bw_Bps=(
            parse_bandwidth_Bps(measured_scaleup, f"{where} measured_scaleup_bw") if measured_scaleup else 0.0
        ),
        host_link=str(table.get("host_link", "")),
        weight_only=tuple(weight_only),
        scaleup_domain=domain,
        chips_per_host=per_host,
        scaleup=scaleup,
        nic_bw_Bps=parse_bandwidth_Bps(table["nic_bw"], f"{where} nic_bw") if "nic_bw" in table else 0.0,
        generation=str(table["generation"]),
        fp4_format=fp4_format,
        vendor=table["vendor"],
        measured=tuple(measured_here),
        serving_gemm_fraction=gemm_fraction,
    )


def _tflops(table: object, where: str) -> dict[str, float]:
    """{precision: TFLOPS} -> {precision: FLOP/s}."""
    if not isinstance(table, dict):
        raise UserError(f"{where}: expected a table such as {{ bf16 = 989 }}")
    flops = {}
    for precision, tflops in table.items():
        if precision not in PRECISION_BYTES:
            raise UserError(f"{where}: unknown precision {precision!r}; use one of {', '.join(PRECISION_BYTES)}")
        if isinstance(tflops, bool) or not isinstance(tflops, (int, float)) or tflops <= 0:
            raise UserError(f"{where}.{precision}: expected a positive number of TFLOPS, got {tflops!r}")
        flops[precision] = float(tflops) * 1e12
    return flops
