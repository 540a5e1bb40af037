"""Pure: numbers, sizes and durations as short words for a phone screen."""

from __future__ import annotations

import re

from bot.core.redact import redact_secrets


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
    """Squash whitespace and cut at a word boundary: "closed after 37…" must not stand for 3734. Redacted
    first: what it cuts is log or process text, and a credential cut in two no longer looks like one."""
    text = " ".join(redact_secrets(text).split())
    if len(text) <= limit:
        return text
    cut = text[: max(0, limit - 1)]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


_PYTHON = re.compile(r"(?:python|pypy)[0-9.]*")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_FLAG_WITH_VALUE = ("-X", "-W")  # python -X dev, -W ignore


def command(cmdline: str, limit: int = 60) -> str:
    """A process's command line for a phone: "/usr/bin/python3 -u /home/me/job.py --config /home/me/run.yaml"
    -> "job.py --config run.yaml". A leading `env`, VAR=value words and the interpreter (with its flags)
    go when a script follows; `python -m pkg` keeps its "python -m"; paths keep their last part."""
    words = cmdline.split()
    i = 0
    while i < len(words) - 1 and (words[i].rsplit("/", 1)[-1] == "env" or _ASSIGNMENT.match(words[i])):
        i += 1
    if i < len(words) - 1 and _PYTHON.fullmatch(words[i].rsplit("/", 1)[-1]):
        j = i + 1
        while j < len(words) - 1 and words[j].startswith("-") and words[j] not in ("-m", "-c"):
            j += 2 if words[j] in _FLAG_WITH_VALUE else 1
        if words[j].startswith("-"):  # -m, -c or only flags: `python3 -m torch.distributed.run` needs its python
            words[i] = words[i].rsplit("/", 1)[-1]
        else:
            i = j
    return trim(" ".join(_last_part(w) for w in words[i:]) or cmdline, limit)


def _last_part(word: str) -> str:
    """"/a/b/run.yaml" -> "run.yaml", "--out=/ckpt/run7/" -> "--out=run7"; a URL or a bare "/" stays."""
    if "/" not in word or "://" in word:
        return word
    key, eq, value = word.partition("=")
    if not eq or "/" in key:  # no "--out=" or "LOG=" before the path
        key, eq, value = "", "", word
    last = value.rstrip("/").rsplit("/", 1)[-1]
    return f"{key}{eq}{last}" if last else word
