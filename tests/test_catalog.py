"""The embedded model and chip catalogs: every entry loads, cites a source, and resolves names."""

from __future__ import annotations

import dataclasses

import pytest

from tokenpath import catalog
from tokenpath.compute import list_chips, list_models, load_chip, load_model
from tokenpath.config.errors import UserError


def test_catalog_lists_the_expected_entries():
    assert list_models() == ["llama-2-7b", "llama-2-70b", "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b",
                             "llama-3.1-405b", "mixtral-8x7b", "qwen2.5-72b", "deepseek-v3", "qwen3-8b", "qwen3-14b",
                             "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b"]
    assert list_chips() == ["a100", "a100-40gb", "h100", "h200", "b200", "gb200", "mi300x", "mi325x", "tpu-v5p",
                            "tpu-v6e", "gaudi3"]


@pytest.mark.parametrize("filename", [catalog.MODELS_FILE, catalog.CHIPS_FILE])
def test_every_entry_cites_a_source(filename):
    for name in catalog.entry_names(filename):
        _, table = catalog.lookup(filename, name, "entry", "x")
        assert table["source"].strip(), name


@pytest.mark.parametrize("name", list_models())
def test_every_model_loads(name):
    assert load_model(name).name == name


@pytest.mark.parametrize("name", list_chips())
def test_every_chip_loads_with_efficiencies_in_range(name):
    chip = load_chip(name)
    assert chip.name == name and "bf16" in chip.peak_flops
    assert all(0 < eff <= 1 for eff in chip.matmul_efficiency.values())
    assert set(chip.matmul_efficiency) == set(chip.peak_flops)


def test_aliases_and_spellings_resolve():
    assert load_model("llama-3.3-70b") == load_model("llama-3.1-70b")
    assert load_model("llama-3.1-70b-instruct").name == "llama-3.1-70b"
    assert load_model("meta-llama/Llama-3.3-70B-Instruct").name == "llama-3.1-70b"
    assert load_chip("H200_SXM").name == "h200"
    assert load_chip("h100-sxm") == load_chip("h100")


def test_unknown_model_suggests_the_nearest_name():
    with pytest.raises(UserError) as err:
        load_model("llama-3-70b")
    assert str(err.value) == "unknown model 'llama-3-70b'; did you mean 'llama-3.1-70b'? See `tokenpath models`."


def test_unknown_chip_suggests_the_nearest_name():
    with pytest.raises(UserError, match=r"unknown chip 'h20'; did you mean 'h200'\? See `tokenpath chips`"):
        load_chip("h20")


def test_unknown_name_without_a_near_match_lists_the_catalog():
    with pytest.raises(UserError, match="known models: llama-2-7b, .*deepseek-v3"):
        load_model("gpt-4")


def test_chip_strings_are_parsed_to_si():
    h200 = load_chip("h200")
    assert h200.hbm_bytes == 141 * 2**30  # the vendor's GB read as the GiB the driver reports
    assert h200.hbm_bw_Bps == pytest.approx(4.8e12)
    assert h200.scaleup_bw_Bps == 450e9
    assert h200.measured_scaleup_bw_Bps == 396e9
    assert h200.peak_flops == {"bf16": 989e12, "fp8": 1979e12}


def test_matmul_efficiency_is_measured_over_peak_or_the_chips_own_or_the_default():
    from tokenpath.compute.efficiency import DEFAULT_MATMUL_EFFICIENCY, SERVING_GEMM_FRACTION

    h100 = load_chip("h100")
    assert h100.matmul_efficiency["bf16"] == pytest.approx(794.5 / 989 * SERVING_GEMM_FRACTION)
    assert h100.matmul_efficiency["fp8"] == pytest.approx(1402.6 / 1979 * SERVING_GEMM_FRACTION)
    # The H200 runs the H100's compute die: its bf16 figure, from AIConfigurator's tables, is within 2%.
    assert load_chip("h200").matmul_efficiency["bf16"] == pytest.approx(808 / 989 * SERVING_GEMM_FRACTION)
    # The B200's fp4, from AIConfigurator's nvfp4 tables.
    assert load_chip("b200").matmul_efficiency["fp4"] == pytest.approx(4435 / 9000 * SERVING_GEMM_FRACTION)
    # A precision no source measures runs at the chip's own measured efficiency: the MI300X's and MI325X's
    # fp8 at their bf16 MAMF's share of the peak (0.51 and 0.60, not the catalog's 0.7); a chip measured at
    # no precision takes the default.
    for chip, bf16_tflops in (("mi300x", 668.4), ("mi325x", 784.9)):
        spec = load_chip(chip)
        assert spec.matmul_efficiency["fp8"] == pytest.approx(spec.matmul_efficiency["bf16"])
        assert spec.matmul_efficiency["fp8"] == pytest.approx(bf16_tflops / spec.peak_flops["bf16"] * 1e12
                                                              * SERVING_GEMM_FRACTION)
    gaudi3 = load_chip("gaudi3")
    assert gaudi3.matmul_efficiency == {"bf16": DEFAULT_MATMUL_EFFICIENCY * SERVING_GEMM_FRACTION,
                                        "fp8": DEFAULT_MATMUL_EFFICIENCY * SERVING_GEMM_FRACTION}


def _catalog_entries_with(monkeypatch, **keys):
    """Every catalog entry read with `keys` set in it."""
    real_lookup = catalog.lookup

    def lookup(filename, name, kind, list_command):
        canonical, table = real_lookup(filename, name, kind, list_command)
        return canonical, {**table, **keys}

    monkeypatch.setattr(catalog, "lookup", lookup)


@pytest.mark.parametrize(("rates", "message"), [
    ({"bf16": 668.4, "fp4": 1000.0}, "measured_matmul_tflops.fp4: the chip has no fp4 peak_tflops; give rates for "
                                     "its peak precisions (bf16, fp8)"),
    ({"bf16": 1400.0}, "measured_matmul_tflops.bf16: must be positive and at most the peak (1307.4)"),
])
def test_a_measured_matmul_rate_the_chip_cannot_run_is_a_one_line_error(monkeypatch, rates, message):
    _catalog_entries_with(monkeypatch, measured_matmul_tflops=rates)
    with pytest.raises(UserError) as error:
        load_chip("mi300x")
    assert str(error.value) == f"catalog chips.toml [mi300x] {message}"


def test_an_unknown_fp4_format_is_a_one_line_error(monkeypatch):
    _catalog_entries_with(monkeypatch, fp4_format="fp4e2m1")
    chip_error = r"^catalog chips.toml \[b200\] fp4_format: one of nvfp4, mxfp4; got 'fp4e2m1'$"
    with pytest.raises(UserError, match=chip_error):
        load_chip("b200")
    with pytest.raises(UserError, match=r"^model llama-3.1-8b: fp4_format must be one of nvfp4, mxfp4, got 'fp4e2m1'$"):
        load_model("llama-3.1-8b")


def test_every_chip_names_its_vendor_and_an_unknown_one_is_a_one_line_error(monkeypatch):
    assert {name: load_chip(name).vendor for name in list_chips()} == {
        "a100": "nvidia", "a100-40gb": "nvidia", "h100": "nvidia", "h200": "nvidia", "b200": "nvidia",
        "gb200": "nvidia", "mi300x": "amd", "mi325x": "amd", "tpu-v5p": "google", "tpu-v6e": "google",
        "gaudi3": "intel"}
    _catalog_entries_with(monkeypatch, vendor="nvida")
    with pytest.raises(UserError, match=r"^catalog chips.toml \[b200\] vendor: one of nvidia, amd, google, intel; "
                                        r"got 'nvida'$"):
        load_chip("b200")


def test_hbm_efficiency_is_the_measured_stream_bandwidth_over_peak_or_the_default():
    """Decode GEMMs measured on A100 stream at 1.509 of its 2.039 TB/s, on MI300X at 3.95 of 5.3; a chip without one
    takes the shared default."""
    from tokenpath.compute.efficiency import HBM_BW_EFFICIENCY

    assert load_chip("a100").hbm_bw_efficiency == pytest.approx(1.509 / 2.039)
    assert load_chip("h200").effective_hbm_bw_Bps == pytest.approx(4.105e12)
    assert load_chip("mi300x").effective_hbm_bw_Bps == pytest.approx(3.95e12)  # hipBLASLt GEMVs
    assert load_chip("mi325x").hbm_bw_efficiency == HBM_BW_EFFICIENCY


def test_a_gemms_fixed_time_is_the_measured_one_or_the_default_and_an_override_replaces_either():
    """AIConfigurator's decode GEMMs give each chip it measures a fixed time per GEMM (5.41 us on A100, 4.34 us on
    H200); a chip it does not measure takes efficiency.GEMM_FIXED_S; an override of gemm_fixed_s replaces both."""
    from tokenpath.compute.efficiency import GEMM_FIXED_S
    from tokenpath.config.assumptions import Assumptions

    assert load_chip("a100").gemm_fixed_s == pytest.approx(5.41e-6)
    assert load_chip("h200").gemm_fixed_s == pytest.approx(4.34e-6)
    assert load_chip("mi325x").gemm_fixed_s == GEMM_FIXED_S == pytest.approx(3.65e-6)
    changed = Assumptions(values={"gemm_fixed_s": 1e-6}, overridden=("gemm_fixed_s",))
    assert load_chip("a100", changed).gemm_fixed_s == load_chip("mi325x", changed).gemm_fixed_s == 1e-6


def test_a_kernels_fixed_time_is_the_measured_one_or_the_default_and_a_gemm_takes_at_least_as_long():
    """Kog AI measured a kernel's launch and clean-up on MI300X at 4.5 us (catalog/chips.toml), where the default
    is the H100's shortest GEMM, 2.45 us; MI300X publishes no GEMM's fixed time, and a GEMM, a kernel too, takes
    at least the kernel's (4.5 us, not the default 3.65). An override of kernel_fixed_s replaces the measured
    value and leaves the GEMM's floor (calibrate engine fits it as an override, starting at the measured value:
    the start must be the model it calibrates); an override of gemm_fixed_s stands whatever the kernel's."""
    from tokenpath.compute.efficiency import KERNEL_FIXED_S
    from tokenpath.config.assumptions import Assumptions

    mi300x = load_chip("mi300x")
    assert mi300x.kernel_fixed_s == mi300x.gemm_fixed_s == pytest.approx(4.5e-6)
    assert "kernel_fixed_s" in mi300x.measured and "gemm_fixed_s" not in mi300x.measured
    assert load_chip("h100").kernel_fixed_s == load_chip("mi325x").kernel_fixed_s == KERNEL_FIXED_S == 2.45e-6
    assert load_chip("h100").gemm_fixed_s == pytest.approx(3.65e-6)  # its own, above its kernel's
    kernel = Assumptions(values={"kernel_fixed_s": 1e-6}, overridden=("kernel_fixed_s",))
    assert load_chip("mi300x", kernel).kernel_fixed_s == 1e-6
    assert load_chip("mi300x", kernel).gemm_fixed_s == pytest.approx(4.5e-6)
    # the measured value as an override: the same chip
    as_override = Assumptions(values={"kernel_fixed_s": 4.5e-6}, overridden=("kernel_fixed_s",))
    assert load_chip("mi300x", as_override) == dataclasses.replace(mi300x, measured=("hbm_bw_efficiency",))
    assert "kernel_fixed_s" not in load_chip("mi300x", kernel).measured
    gemm = Assumptions(values={"gemm_fixed_s": 1e-6}, overridden=("gemm_fixed_s",))
    assert load_chip("mi300x", gemm).gemm_fixed_s == 1e-6 and load_chip("mi300x", gemm).kernel_fixed_s == 4.5e-6


def test_the_40gb_a100_is_the_80gb_part_with_less_and_slower_memory():
    """A100 SXM4 40GB (datasheet): 40 GB of HBM2 at 1.555 TB/s, the 80GB part's FLOPS and NVLink; no measured streaming
    rate is published for it, so it streams at the 80 GB part's measured share of its peak (1.509 of 2.039 TB/s), as
    its MAMF and its GEMMs' fixed time are the 80 GB part's."""
    small, large = load_chip("a100-40gb"), load_chip("a100")
    assert small.hbm_bytes == 40 * 2**30 and large.hbm_bytes == 80 * 2**30
    assert small.peak_flops == large.peak_flops and small.matmul_efficiency == large.matmul_efficiency
    assert small.hbm_bw_efficiency == pytest.approx(large.hbm_bw_efficiency, rel=1e-3)
    assert small.hbm_bw_efficiency == pytest.approx(1.509 / 2.039, rel=1e-3)
    assert small.effective_hbm_bw_Bps == pytest.approx(1.151e12)
    assert small.gemm_fixed_s == large.gemm_fixed_s


def test_an_hbm_efficiency_override_replaces_the_measured_one_too():
    from tokenpath.config.assumptions import Assumptions

    changed = Assumptions(values={"hbm_bw_efficiency": 0.6}, overridden=("hbm_bw_efficiency",))
    assert load_chip("a100", changed).hbm_bw_efficiency == 0.6
    assert load_chip("mi300x", changed).hbm_bw_efficiency == 0.6
    assert load_chip("mi325x", changed).hbm_bw_efficiency == 0.6


@pytest.mark.parametrize("value", ["2.5 TB/s", "0 TB/s"])
def test_a_measured_stream_bandwidth_beyond_the_peak_is_a_one_line_error(monkeypatch, value):
    _catalog_entries_with(monkeypatch, measured_stream_bw=value)
    with pytest.raises(UserError) as error:
        load_chip("a100")
    assert str(error.value) == ("catalog chips.toml [a100] measured_stream_bw: must be positive and at most "
                                f"hbm_bw (2.039 TB/s); got {value!r}")


def test_a_precision_without_tensor_cores_runs_weight_only_where_engines_do():
    """fp8 on A100 and fp4 on Hopper run as vLLM's Marlin kernels run them: stored low, multiplied at bf16."""
    a100, h100 = load_chip("a100"), load_chip("h100")
    assert a100.compute_precision("fp8") == "bf16" and a100.is_weight_only("fp8")
    assert a100.effective_flops("fp8") == a100.effective_flops("bf16")
    assert h100.compute_precision("fp4") == "bf16" and h100.is_weight_only("fp4")
    assert h100.compute_precision("fp8") == "fp8" and not h100.is_weight_only("fp8")
    assert h100.compute_precision("fp16") == "bf16" and not h100.is_weight_only("fp16")
    assert load_chip("b200").compute_precision("fp4") == "fp4"
    assert load_chip("gaudi3").compute_precision("fp8") == "fp8"


@pytest.mark.parametrize("chip, precision", [("tpu-v5p", "fp8"), ("tpu-v6e", "fp4"), ("gaudi3", "fp4")])
def test_a_precision_nothing_runs_is_a_one_line_error(chip, precision):
    with pytest.raises(UserError) as error:
        load_chip(chip).compute_precision(precision)
    message = str(error.value)
    assert message.startswith(f"model.precision: {precision} does not run on {chip} (deployment.chip)")
    # what model.precision may name (fp16 weights are stated as bf16, whose rate they run at)
    assert message.endswith("use one it runs: " + ("bf16, fp8" if chip == "gaudi3" else "bf16"))
    assert "\n" not in message


def test_scaleup_conventions():
    assert load_chip("tpu-v5p").scaleup_bw_Bps == 600e9  # 1200 GB/s bidirectional ICI, halved
    assert load_chip("tpu-v6e").scaleup_bw_Bps == 400e9
    assert load_chip("gaudi3").scaleup_bw_Bps == pytest.approx(21 * 200e9 / 8)  # 21 x 200 GbE
    assert load_chip("mi300x").scaleup_bw_Bps == 7 * 64e9
