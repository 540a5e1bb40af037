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


def size(nbytes: float | None) -> str:
    if nbytes is None:
        return "?"
    v = float(nbytes)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if v < 1024 or unit == "TB":
            return f"{v:.0f} {unit}" if unit == "B" or v >= 100 else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TB"


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
