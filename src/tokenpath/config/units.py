"""Human-readable quantities in config ("900 GB/s", "25 us", "141 GiB") parsed once, at the edge.

Everything inside tokenpath is SI: seconds, bytes, bytes per second. A bare number is taken to be
already in those units. Decimal prefixes (k, M, G, T, P) are powers of 1000, binary ones (Ki, Mi, Gi,
Ti, Pi) powers of 1024. In bandwidths a capital B is bytes and a lower-case b is bits ("400 Gb/s",
"25 Gbps").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

from tokenpath.config.errors import UserError, quoted

_PREFIX = {
    "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50,
}
# Units below a second divide by an exact power of ten ("10 us" is exactly 10 / 1e6), so values
# round-trip through their human strings bit for bit.
_PER_S = {"ns": 1e9, "us": 1e6, "µs": 1e6, "μs": 1e6, "ms": 1e3}
_TIME_S = {"": 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0}
_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>[^\s\d].*?)?\s*$")
PLAIN_NUMBER = re.compile(rf"\s*{_NUMBER}\s*")  # a number written without a unit, as the quantities' parser reads it
_BYTES_UNIT = re.compile(r"^(?P<prefix>[kKMGTP]|[KMGTP]i|)(?P<base>B|bytes?)$")
_BW_UNIT = re.compile(r"^(?P<prefix>[kKMGTP]|[KMGTP]i|)(?P<base>B/s|b/s|bps|Bps)$")


def _split(value: object, what: str, example: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise ValueError(f"expected {what} such as {example!r}, got {value!r}")
    try:
        if isinstance(value, (int, float)):
            number, unit = float(value), ""
        elif isinstance(value, str) and (match := _QUANTITY.match(value)):
            number, unit = float(match["num"]), match["unit"] or ""
        else:
            raise ValueError(f"cannot read {quoted(value)} as {what}; write a number and a unit, e.g. {example!r}")
    except OverflowError:  # an integer beyond any float
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{quoted(value)} is not a finite number; write e.g. {example!r}")
    return number, unit


def _non_negative(number: float, value: object, example: str) -> float:
    if number < 0:
        raise ValueError(f"{quoted(value)} is negative; it must be zero or more, e.g. {example!r}")
    return number


def _with_field(parse: Callable[[object], float]) -> Callable[[object, str], float]:
    """The public parser: the same, raising a UserError that names the config field."""

    def parse_field(value: object, field: str = "value") -> float:
        try:
            return parse(value)
        except ValueError as error:
            raise UserError(f"{field}: {error}") from None

    parse_field.__name__ = parse.__name__.lstrip("_")
    parse_field.__doc__ = parse.__doc__
    return parse_field


def _parse_duration_s(value: object) -> float:
    """'25 us', '20 ms', '1.5 s', '2 min' or a number of seconds -> seconds."""
    example = "20 ms"
    number, unit = _split(value, "a duration", example)
    if unit in _PER_S:
        return _non_negative(number / _PER_S[unit], value, example)
    if unit not in _TIME_S:
        raise ValueError(f"unknown time unit {quoted(unit)} in {quoted(value)}; use one of ns, us, ms, s, min, h")
    return _non_negative(number * _TIME_S[unit], value, example)


def _parse_bytes(value: object) -> float:
    """'141 GiB', '80 GB', '4 KiB', '512 B' or a number of bytes -> bytes."""
    example = "141 GiB"
    number, unit = _split(value, "a size in bytes", example)
    match = _BYTES_UNIT.match(unit) if unit else None
    if unit and not match:
        raise ValueError(f"unknown size unit {quoted(unit)} in {quoted(value)}; use B, kB, MB, GB, KiB, MiB, GiB, ...")
    scale = _PREFIX[match["prefix"]] if match else 1.0
    return _non_negative(number * scale, value, example)


def _parse_bandwidth_Bps(value: object) -> float:
    """'900 GB/s', '400 Gb/s', '25 Gbps', '128 GiB/s' or a number of bytes/s -> bytes per second."""
    example = "900 GB/s"
    number, unit = _split(value, "a bandwidth", example)
    match = _BW_UNIT.match(unit) if unit else None
    if unit and not match:
        raise ValueError(
            f"unknown bandwidth unit {quoted(unit)} in {quoted(value)}; use e.g. GB/s (bytes) or Gb/s, Gbps (bits)"
        )
    scale = 1.0
    if match:
        scale = _PREFIX[match["prefix"]] * (0.125 if match["base"] in ("b/s", "bps") else 1.0)
    return _non_negative(number * scale, value, example)


parse_duration_s = _with_field(_parse_duration_s)
parse_bytes = _with_field(_parse_bytes)
parse_bandwidth_Bps = _with_field(_parse_bandwidth_Bps)


def _exact(value: float, units: tuple[tuple[str, float], ...], parse: Callable[[object], float]) -> str | float:
    """The value as a human string in the largest unit it reaches, when that string parses back to
    exactly the same float; else the plain SI number, which always does."""
    for unit, scale in units:
        if abs(value) >= scale or scale == units[-1][1]:
            text = f"{value / scale:.15g} {unit}"
            return text if parse(text) == value else value
    return value


# The physical range of every quantity a scenario or topology file gives, checked as it is read. The
# bounds lie far outside any real deployment, so a value beyond them is a typo or a unit mistake; they
# also keep every time the simulation derives (in int64 nanoseconds) finite and in range.
MAX_DURATION_S = 3600.0   # latencies, round trips, SLO targets: up to an hour
# Costs paid per engine step, kernel, hop or token (the host's, a copy's, detokenizing, framing) add up over a
# run, so they are held to 1 s, 10^4 x the largest reported (55 us per token, vLLM issue 5206).
MAX_COST_S = 1.0
# Bandwidths from 1 kB/s (below a 9.6 kb/s modem's 1.2 kB/s) up to 100 PB/s, 10^4 x the fastest
# link or memory there is (NVLink 5: 1.8 TB/s per GPU; B200's HBM3e: 8 TB/s).
MIN_BANDWIDTH_BPS = 1e3
MAX_BANDWIDTH_BPS = 1e17


def _within(parse: Callable[[object], float], low: float, high: float, what: str,
            span: str) -> Callable[[object], float]:
    """`parse`, refusing results outside [low, high] with a message that gives the range."""

    def parse_within(value: object) -> float:
        number = parse(value)
        if not low <= number <= high:
            raise ValueError(f"{quoted(value)} is out of range: {what} run from {span}")
        return number

    parse_within.__name__ = parse.__name__
    return parse_within


_bounded_duration_s = _within(_parse_duration_s, 0.0, MAX_DURATION_S, "durations", "0 to 1 h")
_bounded_bandwidth_Bps = _within(_parse_bandwidth_Bps, MIN_BANDWIDTH_BPS, MAX_BANDWIDTH_BPS, "bandwidths",
                                 "1 kB/s to 100 PB/s")

# Config field types: accept human strings or SI numbers, hold SI floats, write human strings back.
Duration = Annotated[
    float,
    BeforeValidator(_bounded_duration_s),
    PlainSerializer(lambda v: _exact(v, (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)), _parse_duration_s),
                    when_used="json"),
]
Size = Annotated[
    float,
    BeforeValidator(_parse_bytes),
    PlainSerializer(lambda v: _exact(v, (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10), ("B", 1.0)),
                                     _parse_bytes),
                    when_used="json"),
]
Bandwidth = Annotated[
    float,
    BeforeValidator(_bounded_bandwidth_Bps),
    PlainSerializer(lambda v: _exact(v, (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3), ("B/s", 1.0)),
                                      _parse_bandwidth_Bps), when_used="json"),
]


# How a table shows a value that is unknown (None) or not a number (NaN), never as 'nan ns'.
MISSING = "-"


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def format_number(value: float | None, digits: int = 3) -> str:
    """A number as people write it: `digits` significant digits, never an exponent, thousands
    separated, trailing zeros dropped: 3830.4 -> '3,830', 0.0123456 -> '0.0123', 1e9 -> '1,000,000,000'.

    Integer digits are never rounded away (1234567 stays '1,234,567'): a number is shown to at least
    the unit. Infinities print as 'inf' and '-inf'; None and NaN (unknown) as MISSING.
    """
    if _missing(value):
        return MISSING
    if not math.isfinite(value):
        return str(float(value))
    if value == 0:
        return "0"
    # Rounding first can carry into another digit (999.6 -> 1000), so the decimals follow the rounded value.
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    rounded = round(value, decimals)
    if rounded != 0:
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    text = f"{value:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _scaled(value: float | None, units: tuple[tuple[str, float], ...], smallest: str) -> str:
    """`value` in the largest unit it reaches (`units` largest first), else in `smallest` (scale 1).
    The unit is chosen on the value as shown, so 0.9999 s is '1 s', not '1,000 ms'; an unknown value
    is MISSING."""
    if _missing(value):
        return MISSING
    shown = abs(float(f"{value:.3g}"))
    for unit, scale in units:
        if shown >= scale:
            return f"{format_number(value / scale)} {unit}"
    return f"{format_number(value)} {smallest}"


def format_duration(seconds: float | None) -> str:
    """A duration for people: '812 us', '23.4 ms', '1.25 s', '1,234 s'; '-' when unknown."""
    if seconds == 0:
        return "0 s"
    return _scaled(None if seconds is None else seconds * 1e9, (("s", 1e9), ("ms", 1e6), ("us", 1e3)), "ns")


def format_bytes(size_bytes: float | None) -> str:
    """A size for people, binary prefixes: '1.5 GiB', '1,023 MiB'."""
    return _scaled(size_bytes, (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)), "B")


def format_bandwidth(bw_Bps: float | None) -> str:
    """A bandwidth for people, decimal prefixes: '900 GB/s'."""
    return _scaled(bw_Bps, (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)), "B/s")
