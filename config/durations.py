"""Durations as people write them ("90s", "10m", "1h30m") to seconds and back."""

from __future__ import annotations

import math
import re

from config.validate import show

MAX_DURATION = 365 * 86400.0

_DURATION_HINT = '(use e.g. "90s", "10m", "2h")'
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}  # largest first
_DURATION_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|d|h|m|s))+")
_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|d|h|m|s)")


def parse_duration(value: object, key: str, *, allow_zero: bool = False) -> float:
    """Seconds from "90s", "10m", "2h", "1d", "1h30m", "500ms".

    Raises ValueError `KEY: bad duration … (use e.g. …)` for anything else, including
    booleans, negative numbers, zero (unless `allow_zero`) and a number with no unit: whoever
    writes `loading_grace = 45` means 45 minutes as often as 45 seconds, and a guess either way
    pages someone 60 times too early or too late. Zero needs no unit. An empty `key` leaves the
    prefix out (the registry puts the key in its ConfigError instead).
    """
    try:
        return _duration(value, allow_zero)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}" if key else str(exc)) from None


def format_duration(seconds: float) -> str:
    """The short spelling parse_duration reads back: 5400 -> "1h30m", 0.5 -> "500ms"."""
    millis, out = round(seconds * 1000), []
    for unit in ("d", "h", "m", "s", "ms"):
        count, millis = divmod(millis, round(_UNITS[unit] * 1000))
        if count:
            out.append(f"{count}{unit}")
    return "".join(out) or "0s"


def _duration(value: object, allow_zero: bool) -> float:
    bad = f"bad duration {show(value)} {_DURATION_HINT}"
    unitless = True  # a bare number: fine for zero only
    if isinstance(value, bool):
        raise ValueError(bad)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(bad) from None
    elif isinstance(value, str):
        text = value.strip()
        negative = text.startswith("-")
        body = text[1:] if negative else text
        if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", body):
            seconds = float(body)
        elif _DURATION_RE.fullmatch(body):
            unitless = False
            parts = _PART_RE.findall(body)
            units = [unit for _, unit in parts]
            order = list(_UNITS)
            if len(set(units)) != len(units) or units != sorted(units, key=order.index):
                raise ValueError(
                    f"bad duration {show(value)}: each unit once, largest first {_DURATION_HINT}"
                )
            seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
        else:
            raise ValueError(bad)
        if negative:
            seconds = -seconds
    else:
        raise ValueError(bad)
    if not math.isfinite(seconds):
        raise ValueError(bad)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        least = "zero or more" if allow_zero else "more than zero"
        raise ValueError(f"bad duration {show(value)}: must be {least} {_DURATION_HINT}")
    if seconds and unitless:
        n = f"{seconds:g}"
        raise ValueError(f'bad duration {show(value)}: no unit (write "{n}s" for seconds or "{n}m" for minutes)')
    if seconds > MAX_DURATION:
        raise ValueError(f"bad duration {show(value)}: at most 365d")
    return seconds
