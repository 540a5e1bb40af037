"""Pure: the small grammar every log recogniser shares — rank prefixes, \\r-frames, integers."""

from __future__ import annotations

import re

RANK_PREFIX = re.compile(r"^[ \t]*(?:\[(?:rank|default)(\d+)\]:|\[\d+,(\d+)\]<std(?:out|err)>:) ?")


def split_rank_prefix(text: str) -> tuple[int | None, str]:
    """Strip torchrun (`[rank3]:`, `[default0]:`) and mpirun (`[1,3]<stderr>:`) line prefixes."""
    rank = None
    while m := RANK_PREFIX.match(text):
        rank = int(m[1] or m[2]) if rank is None and len(m[1] or m[2]) < 7 else rank
        text = text[m.end():]
    return rank, text


def last_frame(text: str) -> str:
    """What a terminal would show of a line tqdm rewrote with \r: its last non-blank frame."""
    if "\r" not in text:
        return text if text.strip() else ""
    return next((f for f in reversed(text.split("\r")) if f.strip()), "")


def parse_int(s: str | None) -> int | None:
    s = (s or "").replace(",", "")
    return int(s) if s.isdigit() and len(s) < 19 else None
