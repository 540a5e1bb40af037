"""Pure: numbers, sizes and durations as short words for a phone screen."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """12 s, 4 min, 1 h 05 min, 2 d 3 h."""
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m:02d} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def count(value: float | None) -> str:
    """41324 -> 41.3K, 980 -> 980, 1.25e6 -> 1.25M."""
    if value is None:
        return "?"
    v = float(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= limit:
            return f"{v / limit:.3g}{suffix}"
    return f"{v:.3g}" if v != int(v) else str(int(v))


# Sizes count in powers of 1024 (a log's bytes, nvidia-smi's MiB), so they carry the IEC names of
# those powers: "GB" would claim 10^9 and be 7 % off at GiB, 10 % at TiB.
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _amount(value: float) -> str:
    """Whole numbers from 10 up, one decimal below ("3.6", "2", "43"): a phone needs no more."""
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}".removesuffix(".0")


def size(nbytes: float | None) -> str:
    """1536 -> "1.5 KiB", 12_400_000 -> "12 MiB", 980 -> "980 B"."""
    if nbytes is None:
        return "?"
    value, unit = float(nbytes), 0
    while unit < len(_UNITS) - 1 and round(abs(value)) >= 1024:
        value, unit = value / 1024, unit + 1
    return f"{value:.0f} B" if unit == 0 else f"{_amount(value)} {_UNITS[unit]}"


def gib(mib: float, *more: float, sep: str = "/") -> str:
    """GPU memory (nvidia-smi counts MiB) in GiB, one unit for numbers read side by side:
    gib(43747) -> "43 GiB", gib(30000, 143771) -> "29/140 GiB", gib(a, b, sep="–") -> "43–75 GiB"."""
    return sep.join(_amount(m / 1024) for m in (mib, *more)) + " GiB"


def number(value: float | None) -> str:
    """A loss or a learning rate: four significant digits."""
    return "?" if value is None else f"{value:.4g}"


def percent_change(new: float, old: float) -> str:
    """"+3 %", or "" when there is nothing to say (no old value, or under half a percent)."""
    if not old:
        return ""
    change = (new - old) / old * 100
    return f"{change:+.0f} %" if abs(change) >= 0.5 else ""


def trim(text: str, limit: int) -> str:
    """Squash whitespace and cut at a word boundary: "closed after 37…" must not stand for 3734."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: max(0, limit - 1)]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"
