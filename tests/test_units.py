"""Human quantities in config: parsed exactly, rejected clearly."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from tokenpath.config.errors import UserError
from tokenpath.config.units import (
    MAX_BANDWIDTH_BPS,
    MAX_DURATION_S,
    MIN_BANDWIDTH_BPS,
    Bandwidth,
    Duration,
    Size,
    parse_bandwidth_Bps,
    parse_bytes,
    parse_duration_s,
)

finite = st.floats(min_value=0, max_value=1e15, allow_nan=False, allow_infinity=False)
# The physical ranges config fields accept.
durations = st.floats(min_value=0, max_value=MAX_DURATION_S)
bandwidths = st.floats(min_value=MIN_BANDWIDTH_BPS, max_value=MAX_BANDWIDTH_BPS)


@pytest.mark.parametrize("text, seconds", [
    ("25 us", 25e-6), ("25us", 25e-6), ("25 µs", 25e-6), ("20 ms", 0.02), ("1.5 s", 1.5), ("2 min", 120.0),
    ("500 ns", 5e-7), (0.25, 0.25), ("3", 3.0), ("1e-3 s", 1e-3),
])
def test_durations(text, seconds):
    assert math.isclose(parse_duration_s(text), seconds, rel_tol=1e-12)


@pytest.mark.parametrize("text, size_bytes", [
    ("141 GiB", 141 * 2**30), ("80 GB", 80e9), ("4 KiB", 4096), ("512 B", 512), ("1.5 MB", 1.5e6), (1024, 1024),
])
def test_sizes(text, size_bytes):
    assert parse_bytes(text) == pytest.approx(size_bytes, rel=1e-12)


@pytest.mark.parametrize("text, bw", [
    ("900 GB/s", 900e9), ("400 Gb/s", 50e9), ("25 Gbps", 25e9 / 8), ("128 GiB/s", 128 * 2**30), ("64GB/s", 64e9),
])
def test_bandwidths(text, bw):
    assert parse_bandwidth_Bps(text) == pytest.approx(bw, rel=1e-12)


@pytest.mark.parametrize("parse, text", [
    (parse_duration_s, "5 parsecs"), (parse_duration_s, "fast"), (parse_duration_s, "-3 ms"),
    (parse_bytes, "12 GB/s"), (parse_bandwidth_Bps, "12 GB"), (parse_duration_s, True), (parse_bytes, "nan GB"),
])
def test_bad_quantities_name_the_field(parse, text):
    with pytest.raises(UserError, match=r"^delivery\.x: "):
        parse(text, "delivery.x")


@given(finite, st.sampled_from([("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0), ("min", 60.0)]))
def test_any_number_with_a_time_unit_scales(number, unit):
    name, scale = unit
    assert math.isclose(parse_duration_s(f"{number!r} {name}"), number * scale, rel_tol=1e-12, abs_tol=1e-300)


@given(finite, st.sampled_from(["", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"]), st.sampled_from(["B", "b"]))
def test_any_bandwidth_scales_by_prefix_and_bits(number, prefix, base):
    scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[prefix]
    expected = number * scale / (8 if base == "b" else 1)
    assert math.isclose(parse_bandwidth_Bps(f"{number!r} {prefix}{base}/s"), expected, rel_tol=1e-12, abs_tol=1e-300)


@given(st.one_of(st.sampled_from(["kiB", "kib/s", "kiBps", "KiB", "kB"]), st.text(alphabet="kKMGTPiIbBytes/p ",
                                                                                  max_size=8)))
def test_any_unit_text_parses_or_is_one_line_naming_the_field(unit):
    """A prefix the pattern takes and the table lacks ("1 kiB") was a KeyError and a traceback."""
    for parse in (parse_bytes, parse_bandwidth_Bps):
        try:
            value = parse(f"1 {unit}", "delivery.x")
        except UserError as error:
            assert str(error).startswith("delivery.x: ") and "\n" not in str(error)
        else:
            assert value > 0


class Quantities(BaseModel):
    duration: Duration
    size: Size
    bandwidth: Bandwidth


@given(durations, finite, bandwidths)
def test_config_types_round_trip_through_their_human_strings(d, s, b):
    original = Quantities(duration=d, size=s, bandwidth=b)
    written = original.model_dump(mode="json")
    # a human string where one reads back exactly, else the SI number
    assert all(isinstance(value, (str, float)) for value in written.values())
    assert Quantities.model_validate(written) == original


@pytest.mark.parametrize("field, value, fragment", [
    ("duration", 1e308, "1e+308 is out of range: durations run from 0 to 1 h"),
    ("duration", 9223372036854775807, "9223372036854775807 is out of range"),
    ("duration", "61 min", "'61 min' is out of range"),
    ("duration", 10**400, "not a finite number"),
    ("bandwidth", "1e308 GB/s", "'1e308 GB/s' is out of range: bandwidths run from 1 kB/s to 100 PB/s"),
    ("bandwidth", 0, "0 is out of range"),
    ("bandwidth", 1e-300, "1e-300 is out of range"),
    ("bandwidth", "999 B/s", "out of range"),
    ("bandwidth", "101 PB/s", "out of range"),
    ("bandwidth", "x" * 5000 + " GB/s", "... (5,005 characters)"),
])
def test_config_quantities_outside_their_physical_range_are_refused(field, value, fragment):
    values = {"duration": 1.0, "size": 1.0, "bandwidth": 1e9, field: value}
    with pytest.raises(ValueError, match=r"^1 validation error") as raised:
        Quantities.model_validate(values)
    message = raised.value.errors()[0]["msg"]
    assert fragment in message
    assert len(message) < 300  # a bad value is quoted, not copied whole


@pytest.mark.parametrize("field, value", [
    ("duration", 0.0), ("duration", "1 h"), ("bandwidth", "1 kB/s"), ("bandwidth", "100 PB/s"), ("bandwidth", "8 kb/s"),
])
def test_the_ends_of_each_physical_range_are_accepted(field, value):
    values = {"duration": 1.0, "size": 1.0, "bandwidth": 1e9, field: value}
    assert Quantities.model_validate(values) is not None


@pytest.mark.parametrize("text", ["10 us", "20 ms", "1.5 s", "64 GB/s", "141 GiB", "400 Gb/s"])
def test_round_values_are_written_back_as_written(text):
    field = "duration" if text.endswith("s") and "/" not in text else "bandwidth" if "/" in text else "size"
    values = {"duration": 1.0, "size": 1.0, "bandwidth": 1e9, field: text}
    written = Quantities.model_validate(values).model_dump(mode="json")[field]
    assert (Quantities.model_validate({**values, field: written}).model_dump()[field]
            == Quantities.model_validate(values).model_dump()[field])
    assert isinstance(written, str)


# -- numbers for people ------------------------------------------------------------------------------

from tokenpath.config.units import format_bandwidth, format_bytes, format_duration, format_number  # noqa: E402


@pytest.mark.parametrize("value, text", [
    (3830.4, "3,830"), (0.0123456, "0.0123"), (1e9, "1,000,000,000"), (999.6, "1,000"), (0.9996, "1"),
    (-5.5, "-5.5"), (12.0, "12"), (0.0, "0"), (1e-7, "0.0000001"), (math.inf, "inf"),
])
def test_format_number_examples(value, text):
    assert format_number(value) == text


@pytest.mark.parametrize("shown, text", [
    (format_duration(1234.5), "1,234 s"), (format_duration(0.9999), "1 s"), (format_duration(0.0925), "92.5 ms"),
    (format_bytes(1000 * 2**20), "1,000 MiB"), (format_bytes(4e9), "3.73 GiB"), (format_bytes(12), "12 B"),
    (format_bandwidth(3.83e3), "3.83 kB/s"), (format_duration(3e-9), "3 ns"),
])
def test_formatted_quantities(shown, text):
    assert shown == text


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e18, max_value=1e18))
def test_format_number_is_plain_and_close(value):
    """No exponent, only digits, separators, a sign and a point; and it reads back within 3 significant
    digits (or half a unit, for numbers shown to the unit)."""
    text = format_number(value)
    assert "e" not in text.lower() and set(text) <= set("0123456789,.-")
    back = float(text.replace(",", ""))
    assert abs(back - value) <= max(0.005 * abs(value) * (1 + 1e-9), 0.5 if abs(value) >= 100 else 0) or \
        abs(back - value) <= 5 * 10 ** (math.floor(math.log10(abs(value))) - 3) if value else back == 0


@given(st.floats(min_value=0, max_value=1e16, allow_nan=False))
def test_formatted_quantities_have_no_exponent(value):
    for text in (format_duration(value), format_bytes(value), format_bandwidth(value)):
        assert "e+" not in text and "e-" not in text


@pytest.mark.parametrize("unknown", [None, math.nan])
def test_an_unknown_quantity_is_a_dash_never_nan(unknown):
    assert ([format_duration(unknown), format_number(unknown), format_bytes(unknown), format_bandwidth(unknown)]
            == ["-"] * 4)
    assert format_duration(math.inf) == "inf s" and format_number(-math.inf) == "-inf"
